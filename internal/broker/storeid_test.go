package broker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/requestlog"
	"github.com/credpool/credpool/internal/sqlitestore"
	"github.com/credpool/credpool/internal/sqlitex/sqlitextest"
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
	db := sqlitextest.Temp(t)
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
// as long as the first one's leases may be in use. The key moves from
// the first to the second and back, one store asking at a time (a move;
// two stores asking at once is the misconfiguration the README warns of:
// they may hold the key back for good). By the leases' own times, the
// key never has more holders than its limit across both stores; and both
// did grant it.
func TestTwoSQLiteStoresHoldAMovedKey(t *testing.T) {
	_, c := newCatalog(t)
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	const maxLease = 300 * time.Millisecond
	stores := []sqliteStore{newSQLiteStore(t, c, maxLease, log), newSQLiteStore(t, c, maxLease, log)}
	a, _ := stores[0].id.ID()
	b, _ := stores[1].id.ID()
	require.NotEqual(t, a, b, "two files, two ids")
	_, err := stores[0].admin.Put(t.Context(), key("a", "default", 1))
	require.NoError(t, err)

	type held struct {
		store      int
		from, till time.Time
	}
	var grants []held
	r := req("default")
	r.TTL = maxLease
	for _, i := range []int{0, 1, 0} {
		for end := time.Now().Add(4 * maxLease); time.Now().Before(end); time.Sleep(maxLease / 10) {
			g, err := stores[i].broker.Allocate(t.Context(), r)
			var full *optimistic.CapacityError
			switch {
			case errors.As(err, &full):
			case err != nil:
				require.NoError(t, err)
			default:
				// The lease began at its expiry less its TTL, by the
				// clock that timed the other's expiry: the call may have
				// started before that one expired.
				grants = append(grants, held{i, g.Until.Add(-r.TTL), g.Until})
			}
		}
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

// A lease of a key that another store has synced since ends at its next
// renewal: that store held the key back for as long as a lease lives,
// counting this one out, and grants it again after.
func TestRenewOfAKeyAnotherStoreServedIsRevoked(t *testing.T) {
	_, c := newCatalog(t)
	const maxLease = time.Minute
	stores := []sqliteStore{newSQLiteStore(t, c, maxLease, nil), newSQLiteStore(t, c, maxLease, nil)}
	_, err := stores[0].admin.Put(t.Context(), key("a", "default", 1))
	require.NoError(t, err)
	r := req("default")
	r.TTL = maxLease
	g, err := stores[0].broker.Allocate(t.Context(), r)
	require.NoError(t, err)
	_, err = stores[0].broker.Renew(t.Context(), g.LeaseRef, maxLease)
	require.NoError(t, err, "renewed while the key is this store's")

	_, err = stores[1].broker.Allocate(t.Context(), r)
	require.ErrorIs(t, err, optimistic.ErrNoCapacity, "the other store holds the key back")
	_, err = stores[0].broker.Renew(t.Context(), g.LeaseRef, maxLease)
	require.ErrorIs(t, err, optimistic.ErrLeaseLost, "the holder stops: the other store will grant the key when its hold ends")
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
// store ids), and a key that reached no store yet is marked with the
// empty name, so that a loss of it is still noticed; once the id answers,
// a grant reads it and the keys are marked with it, and a key another
// store synced is held back.
func TestUnreadStoreIDServes(t *testing.T) {
	e := newEnv(t, key("a", "default", 1), key("c", "default", 1))
	ctx := t.Context()
	_, err := e.cat.SQL.Put(ctx, key("b", "default", 1))
	require.NoError(t, err)
	// c is in this store, and another store synced it since.
	require.NoError(t, e.cat.SQL.MarkSynced(ctx, "another-store", time.Now(), "c"))
	ids := &downIDs{IDStore: e.store}
	ids.down.Store(true)
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	id := broker.NewStoreID(ctx, ids, log)
	_, known := id.ID()
	require.False(t, known)
	require.Contains(t, logs.String(), "lease store id not read")
	b := broker.New(e.cat, e.store, &broker.Options{Requests: e.requests, Logger: log, StoreID: id})
	t.Cleanup(func() { b.Close(ctx) })
	admin := broker.NewAdmin(e.cat, e.store, &broker.Options{Logger: log, StoreID: id})
	r := req("default")
	use := func() string {
		g, err := b.Allocate(ctx, r)
		require.NoError(t, err, logs.String())
		require.NoError(t, b.Release(ctx, g.LeaseRef))
		return g.KeyID
	}
	// Limit 1 each, released at once: the first key in the order grants.
	// Each key is made the only usable one in turn.
	only := func(want string) {
		for _, k := range []string{"a", "b", "c"} {
			status := optimistic.StatusDisabled
			if k == want {
				status = optimistic.StatusAvailable
			}
			_, err := admin.Update(ctx, k, catalog.Patch{Status: &status})
			require.NoError(t, err)
		}
	}
	for _, k := range []string{"a", "b", "c"} {
		only(k)
		require.Equal(t, k, use())
		require.True(t, e.get(t, k).QuarantineUntil.IsZero(), "%s: not held back while the id is unread", k)
	}
	require.False(t, e.get(t, "b").SyncedAt.IsZero(), "b is marked as having reached a store")
	require.Equal(t, "", e.get(t, "b").SyncedStore, "with the name every instance counts as its own")
	require.Equal(t, "another-store", e.get(t, "c").SyncedStore, "c's mark is left alone")

	ids.down.Store(false)
	only("b")
	for deadline := time.Now().Add(10 * time.Second); ; {
		use()
		if _, known := id.ID(); known {
			break
		}
		require.True(t, time.Now().Before(deadline), "the id was never read")
		time.Sleep(100 * time.Millisecond)
	}
	want, _ := id.ID()
	only("c")
	_, err = b.Allocate(ctx, r)
	require.ErrorIs(t, err, optimistic.ErrNoCapacity, "c, another store's, is held back once the id is known")
	require.False(t, e.get(t, "c").QuarantineUntil.IsZero())
	for _, k := range []string{"a", "b"} {
		require.Equal(t, want, e.get(t, k).SyncedStore, k)
		require.True(t, e.get(t, k).QuarantineUntil.IsZero(), k)
	}
}

// A grant of a key marked with a name this process does not know, while
// the store's id does not answer, is given back as the store's failure
// (503), not as a full pool (429).
func TestUnreadStoreIDIsAStoreFailure(t *testing.T) {
	e := newEnv(t, key("a", "default", 1))
	ctx := t.Context()
	ids := &downIDs{IDStore: e.store}
	id := broker.NewStoreID(ctx, ids, nil)
	_, known := id.ID()
	require.True(t, known)
	b := broker.New(e.cat, e.store, &broker.Options{Requests: e.requests, StoreID: id})
	t.Cleanup(func() { b.Close(ctx) })
	g, err := b.Allocate(ctx, req("default"))
	require.NoError(t, err)
	require.NoError(t, b.Release(ctx, g.LeaseRef))

	ids.down.Store(true)
	require.NoError(t, e.cat.SQL.MarkSynced(ctx, "a-new-id", time.Now(), "a"))
	time.Sleep(broker.RereadEvery) // the last read is old enough to read again
	_, err = b.Allocate(ctx, req("default"))
	require.ErrorIs(t, err, optimistic.ErrStore)
	require.NotErrorIs(t, err, optimistic.ErrNoCapacity)
	require.Zero(t, e.live(t, "a"), "the grant was given back")
}

// blockedIDs is a store whose id read holds until release is closed.
type blockedIDs struct {
	broker.IDStore
	reads   atomic.Int32
	release chan struct{}
}

func (d *blockedIDs) EnsureID(ctx context.Context, id string) (string, bool, error) {
	d.reads.Add(1)
	<-d.release
	return d.IDStore.EnsureID(ctx, id)
}

// While one read of the store's id hangs (a silent server), the other
// allocates go by the names known instead of waiting in turn behind it.
func TestStoreIDReadHoldsUpOneRequest(t *testing.T) {
	e := newEnv(t, key("a", "default", 20))
	ctx := t.Context()
	ids := &blockedIDs{IDStore: e.store, release: make(chan struct{})}
	close(ids.release)
	id := broker.NewStoreID(ctx, ids, nil) // read once, at start
	ids.release = make(chan struct{})
	b := broker.New(e.cat, e.store, &broker.Options{Requests: e.requests, StoreID: id})
	t.Cleanup(func() { b.Close(ctx) })
	t.Cleanup(sync.OnceFunc(func() { close(ids.release) }))
	require.NoError(t, e.cat.SQL.MarkSynced(ctx, "a-new-id", time.Now(), "a"))
	time.Sleep(broker.RereadEvery)

	hung := make(chan error, 1)
	go func() {
		_, err := b.Allocate(ctx, req("default"))
		hung <- err
	}()
	require.Eventually(t, func() bool { return ids.reads.Load() == 2 }, 10*time.Second, time.Millisecond,
		"the first allocate reads the id")
	for range 5 {
		bounded, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := b.Allocate(bounded, req("default"))
		cancel()
		require.ErrorIs(t, err, optimistic.ErrNoCapacity, "answered while the read hangs: a is another store's as far as known")
	}
	require.EqualValues(t, 2, ids.reads.Load(), "one read at a time")
	ids.release <- struct{}{}
	require.ErrorIs(t, <-hung, optimistic.ErrNoCapacity, "a-new-id is not the store's id: held back")
}
