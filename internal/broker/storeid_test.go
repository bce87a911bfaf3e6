package broker_test

import (
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/requestlog"
	"github.com/credpool/credpool/internal/sqlitestore"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
)

// sqliteStore is a SQLite lease store in a file of its own, named by the
// id it keeps, with a Broker and an Admin over c.
type sqliteStore struct {
	id     *broker.StoreID
	broker *broker.Broker
	admin  *broker.Admin
}

func newSQLiteStore(t *testing.T, c *catalog.SQL, maxLease time.Duration, log *slog.Logger) sqliteStore {
	t.Helper()
	db, err := sqlitex.Open(filepath.Join(t.TempDir(), "leases.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	s, err := sqlitestore.New(t.Context(), db, nil)
	require.NoError(t, err)
	requests, err := requestlog.NewSQLite(t.Context(), db)
	require.NoError(t, err)
	id, err := broker.NewStoreID(t.Context(), s, log)
	require.NoError(t, err)
	opts := &broker.Options{Requests: requests, Logger: log, MaxLease: maxLease, Losses: broker.NewLosses(), StoreID: id}
	b := broker.New(cache(t, c), s, opts)
	t.Cleanup(func() { b.Close(t.Context()) })
	return sqliteStore{id: id, broker: b, admin: broker.NewAdmin(c, s, opts)}
}

// Two SQLite lease stores, each in its own file, share one catalog (as
// two instances with stores of their own would): each keeps its own id,
// so a key that moved from one to the other is held back, both ways, for
// as long as the first one's leases may be in use. By the leases' own
// times, the key never has more holders than its limit across both
// stores; and both did grant it.
func TestTwoSQLiteStoresHoldAMovedKey(t *testing.T) {
	db, err := sqlitex.Open(filepath.Join(t.TempDir(), "catalog.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	c, err := catalog.New(t.Context(), db, nil)
	require.NoError(t, err)
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	const maxLease = 300 * time.Millisecond
	stores := []sqliteStore{newSQLiteStore(t, c, maxLease, log), newSQLiteStore(t, c, maxLease, log)}
	require.NotEqual(t, stores[0].id.ID(), stores[1].id.ID(), "two files, two ids")
	_, err = stores[0].admin.Put(t.Context(), key("a", "default", 1))
	require.NoError(t, err)

	type held struct {
		store      int
		from, till time.Time
	}
	var grants []held
	r := req("default")
	r.TTL = maxLease
	for round, end := 0, time.Now().Add(8*maxLease); time.Now().Before(end); round++ {
		for j := range stores {
			i := (round + j) % len(stores) // each store in turn asks first
			s, from := stores[i], time.Now()
			g, err := s.broker.Allocate(t.Context(), r)
			var full *optimistic.CapacityError
			switch {
			case errors.As(err, &full):
			case err != nil:
				require.NoError(t, err)
			default:
				grants = append(grants, held{i, from, g.Until})
			}
		}
		time.Sleep(maxLease / 10)
	}
	granted := map[int]bool{}
	for i, g := range grants {
		granted[g.store] = true
		for _, h := range grants[:i] {
			require.False(t, g.from.Before(h.till),
				"store %d granted at %v while store %d's lease held until %v", g.store, g.from, h.store, h.till)
		}
	}
	require.Len(t, granted, 2, "both stores granted the key in turn: %v", grants)
	require.Contains(t, logs.String(), "served by another lease store")
	k, err := c.Key(t.Context(), "a")
	require.NoError(t, err)
	require.True(t, k.SyncedStore == stores[0].id.ID() || k.SyncedStore == stores[1].id.ID(), k.SyncedStore)
	require.False(t, strings.Contains(logs.String(), "adopted"), "neither took the other's id")
}
