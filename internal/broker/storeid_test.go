package broker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
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
	id := broker.NewStoreID(t.Context(), s, log)
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
	a, _ := stores[0].id.ID()
	b, _ := stores[1].id.ID()
	require.NotEqual(t, a, b, "two files, two ids")
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
	require.True(t, k.SyncedStore == a || k.SyncedStore == b, k.SyncedStore)
	require.False(t, strings.Contains(logs.String(), "adopted"), "neither took the other's id")
}

// downIDs is a store whose id cannot be read while down is set, as on a
// Redis Cluster whose id's master is down.
type downIDs struct {
	broker.IDStore
	down atomic.Bool
}

func (d *downIDs) EnsureID(ctx context.Context, id string) (string, bool, error) {
	if d.down.Load() {
		return "", false, fmt.Errorf("%w: %w: the id's server is down", optimistic.ErrStore, optimistic.ErrUnreachable)
	}
	return d.IDStore.EnsureID(ctx, id)
}

// A store whose id cannot be read at start still serves: while the id is
// unread, a key another store synced counts as this store's (as before
// store ids) and no key is marked synced; once the id answers, a grant
// reads it and the keys are marked with it.
func TestUnreadStoreIDServes(t *testing.T) {
	e := newEnv(t, key("a", "default", 1))
	_, err := e.cat.SQL.Put(t.Context(), key("b", "default", 1))
	require.NoError(t, err)
	ids := &downIDs{IDStore: e.store}
	ids.down.Store(true)
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	id := broker.NewStoreID(t.Context(), ids, log, "") // "": newEnv synced "a" unnamed
	_, known := id.ID()
	require.False(t, known)
	require.Contains(t, logs.String(), "lease store id not read")
	b := broker.New(e.cat, e.store, &broker.Options{Requests: e.requests, Logger: log, StoreID: id})
	t.Cleanup(func() { b.Close(t.Context()) })
	r := req("default")
	use := func() {
		g, err := b.Allocate(t.Context(), r)
		require.NoError(t, err)
		require.NoError(t, b.Release(t.Context(), g.LeaseRef))
	}
	for range 4 {
		use()
	}
	for _, k := range []string{"a", "b"} {
		require.True(t, e.get(t, k).QuarantineUntil.IsZero(), "%s: not held back", k)
	}
	require.True(t, e.get(t, "b").SyncedAt.IsZero(), "not marked while the id is unread")

	ids.down.Store(false)
	require.Eventually(t, func() bool {
		use()
		_, known := id.ID()
		return known
	}, 5*time.Second, 100*time.Millisecond)
	want, _ := id.ID()
	admin := broker.NewAdmin(e.cat, e.store, &broker.Options{Logger: log, StoreID: id})
	_, err = admin.Sync(t.Context())
	require.NoError(t, err)
	for _, k := range []string{"a", "b"} {
		require.Equal(t, want, e.get(t, k).SyncedStore, k)
		require.True(t, e.get(t, k).QuarantineUntil.IsZero(), k)
	}
}
