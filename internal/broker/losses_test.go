package broker_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/optimistic"
)

// A key the store lost (here deleted behind the broker's back, as a flush
// or a restart without persistence does) while a lease on it was in use is
// not handed out again at once: the lease may still be in use for up to
// MaxLease. It is held back until then, said so, and then granted again
// with a fencing token above every earlier one.
func TestLostKeyIsHeldBack(t *testing.T) {
	e := newEnv(t, key("a", "default", 1))
	const maxLease = 1500 * time.Millisecond
	opts := &broker.Options{Requests: e.requests, Logger: e.log, MaxLease: maxLease, Losses: broker.NewLosses()}
	b := broker.New(e.cat, e.store, opts)
	admin := broker.NewAdmin(e.cat, e.store, opts)
	losses := func() broker.LossReport {
		l, err := admin.Losses(t.Context())
		require.NoError(t, err)
		return l
	}
	r := req("default")
	r.TTL = maxLease
	held := allocate(t, b, r)
	require.NoError(t, e.store.DeleteKey(t.Context(), "a"))

	before := time.Now()
	_, err := b.Allocate(t.Context(), r)
	full := capacityError(t, err)
	require.WithinDuration(t, before.Add(maxLease), full.FreeAt, time.Second, "held back for MaxLease")
	require.False(t, full.Held, "a quarantine's end is exact")
	require.Equal(t, full.FreeAt.UnixMilli(), e.get(t, "a").QuarantineUntil.UnixMilli())
	require.Equal(t, optimistic.StatusCooldown, e.info(t, "a").Status, "the store refuses it too")
	require.Equal(t, broker.LossReport{Held: 1, Until: e.get(t, "a").QuarantineUntil, Total: 1}, losses())

	// An admin's upsert (a new model, say) does not lift it.
	k := key("a", "default", 1)
	k.Models = append(k.Models, "gpt-4o-mini")
	_, err = admin.Put(t.Context(), k)
	require.NoError(t, err)
	_, err = b.Allocate(t.Context(), r)
	capacityError(t, err)
	require.Equal(t, int64(1), losses().Total, "found once")

	time.Sleep(time.Until(full.FreeAt) + 50*time.Millisecond)
	again := allocate(t, b, r)
	require.Greater(t, again.Fence, held.Fence, "fencing tokens never go back")
	require.Zero(t, losses().Held)
	require.True(t, e.get(t, "a").QuarantineUntil.IsZero(), "cleared once over")
}

// A report that updates the store (a rate limit) after the store lost the
// key must not bring it back unnoticed: the key is held back.
func TestReportAfterLossHoldsBack(t *testing.T) {
	e := newEnv(t, key("a", "default", 2))
	opts := &broker.Options{Requests: e.requests, Logger: e.log, MaxLease: time.Hour, Losses: broker.NewLosses()}
	b := broker.New(e.cat, e.store, opts)
	admin := broker.NewAdmin(e.cat, e.store, opts)
	g := allocate(t, b, req("default"))
	allocate(t, b, req("default")) // still in use when the store loses the key
	s := &hookStore{Store: e.store}
	bs := broker.New(e.cat, s, opts)
	// The store loses the key after the report checked the lease and
	// before it records the rate limit and updates the store.
	s.afterHolds = func() { require.NoError(t, e.store.DeleteKey(t.Context(), "a")) }
	require.NoError(t, bs.Report(t.Context(), g.LeaseRef, catalog.OutcomeRateLimited, time.Millisecond))
	s.afterHolds = nil
	require.False(t, e.get(t, "a").QuarantineUntil.IsZero(), "held back while the other lease may still be in use")
	l, err := admin.Losses(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(1), l.Total, "found by the report")
	require.Equal(t, 1, l.Held)

	time.Sleep(5 * time.Millisecond) // the rate limit's cooldown is over
	_, err = b.Allocate(t.Context(), req("default"))
	capacityError(t, err)
}

// A key the store lacks because the service moved to another store (or an
// instance was pointed at another by mistake) is held back too: leases
// the first store granted may still be in use. An operator who knows they
// are not lifts the hold by clearing the key's leases.
func TestNewStoreHoldsBack(t *testing.T) {
	e := newEnv(t, key("a", "default", 1))
	held := allocate(t, e.broker(e.cat, e.store), req("default"))
	var logs lockedBuffer
	opts := &broker.Options{
		Requests: e.requests, Logger: slog.New(slog.NewTextHandler(&logs, nil)), StoreID: broker.FixedStoreID("another-redis"),
		MaxLease: time.Hour, Losses: broker.NewLosses(),
	}
	moved := broker.New(e.cat, e.store, opts)
	require.NoError(t, e.store.DeleteKey(t.Context(), "a"))

	_, err := moved.Allocate(t.Context(), req("default"))
	full := capacityError(t, err)
	require.WithinDuration(t, time.Now().Add(time.Hour), full.FreeAt, time.Minute, "held back for MaxLease")
	require.Contains(t, logs.String(), "served by another lease store")

	admin := broker.NewAdmin(e.cat, e.store, opts)
	n, err := admin.ClearLeases(t.Context(), "a")
	require.NoError(t, err)
	require.Zero(t, n, "the new store had none")
	require.True(t, e.get(t, "a").QuarantineUntil.IsZero(), "lifted")
	again := allocate(t, moved, req("default"))
	require.Greater(t, again.Fence, held.Fence)
	require.Equal(t, "another-redis", e.get(t, "a").SyncedStore)
}

// Clearing a key's leases lifts the hold on a key the store lost, and the
// key grants again at once; a key with no hold is left as it is.
func TestClearLeasesLiftsAHold(t *testing.T) {
	e := newEnv(t, key("a", "default", 1), key("b", "other", 1))
	opts := &broker.Options{Requests: e.requests, Logger: e.log, MaxLease: time.Hour, Losses: broker.NewLosses()}
	b := broker.New(e.cat, e.store, opts)
	admin := broker.NewAdmin(e.cat, e.store, opts)
	r := req("default")
	allocate(t, b, r)
	require.NoError(t, e.store.DeleteKey(t.Context(), "a"))
	_, err := b.Allocate(t.Context(), r)
	capacityError(t, err)

	n, err := admin.ClearLeases(t.Context(), "a")
	require.NoError(t, err)
	require.Zero(t, n)
	allocate(t, b, r)
	l, err := admin.Losses(t.Context())
	require.NoError(t, err)
	require.Zero(t, l.Held)

	before := e.get(t, "b")
	n, err = admin.ClearLeases(t.Context(), "b")
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, before.UpdatedAt, e.get(t, "b").UpdatedAt, "nothing to lift: nothing written")
	_, err = admin.ClearLeases(t.Context(), "nope")
	require.ErrorIs(t, err, catalog.ErrNotFound)
}

// A quarantined key deleted meanwhile is gone, not a failure: the pass
// that meets it answers that no key left frees up by itself (policy), not
// "full" until a deleted key's quarantine ends (seen with a catalog whose
// generation reads miss the deletes); and the answer given is the current
// catalog's, which has no keys left.
func TestLostKeyDeletedMeanwhile(t *testing.T) {
	for _, frozen := range []bool{true, false} {
		t.Run(fmt.Sprintf("frozen=%v", frozen), func(t *testing.T) {
			e := newEnv(t, key("a", "default", 1), key("b", "default", 1))
			c := &flakyCatalog{Cache: e.cat, frozen: frozen}
			b := broker.New(c, e.store, &broker.Options{Logger: e.log})
			allocate(t, b, req("default"))
			require.NoError(t, e.store.DeleteKey(t.Context(), "a"))
			require.NoError(t, e.store.DeleteKey(t.Context(), "b"))
			c.beforeQuarantine = func(id string) { _ = e.cat.Delete(t.Context(), id) }
			_, err := b.Allocate(t.Context(), req("default"))
			want := broker.ErrNoCandidates
			if frozen {
				want = broker.ErrPolicy
			}
			require.ErrorIs(t, err, want)
			require.NotErrorIs(t, err, catalog.ErrNotFound)
			for _, id := range []string{"a", "b"} {
				require.False(t, e.info(t, id).Exists, "key %s is not written back", id)
			}
		})
	}
}

// A key that never reached the store is no loss: the first sync grants at
// once. The admin's Sync tells the two apart as well.
func TestNewKeyIsNoLoss(t *testing.T) {
	e := newEnv(t)
	_, err := e.cat.Put(t.Context(), key("a", "default", 1))
	require.NoError(t, err)
	b := e.plain()
	allocate(t, b, req("default"))
	require.False(t, e.get(t, "a").SyncedAt.IsZero(), "the repair recorded the first sync")

	_, err = e.cat.Put(t.Context(), key("b", "default", 1))
	require.NoError(t, err)
	losses := broker.NewLosses()
	admin := broker.NewAdmin(e.cat, e.store, &broker.Options{Losses: losses, Logger: e.log})
	require.NoError(t, e.store.DeleteKey(t.Context(), "a"))
	n, err := admin.Sync(t.Context())
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, optimistic.StatusCooldown, e.info(t, "a").Status, "a was lost: held back")
	require.Equal(t, optimistic.StatusAvailable, e.info(t, "b").Status, "b was new")
	l, err := admin.Losses(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, l.Held)
	require.Equal(t, int64(1), l.Total)
}

// The longest lease is a setting: a longer one is refused, for allocate
// and renew.
func TestMaxLease(t *testing.T) {
	e := newEnv(t, key("a", "default", 1))
	b := broker.New(e.cat, e.store, &broker.Options{MaxLease: time.Minute, Logger: e.log})
	r := req("default")
	r.TTL = time.Minute + time.Second
	_, err := b.Allocate(t.Context(), r)
	require.ErrorIs(t, err, optimistic.ErrInvalid)
	g := allocate(t, b, req("default"))
	_, err = b.Renew(t.Context(), g.LeaseRef, 2*time.Minute)
	require.ErrorIs(t, err, optimistic.ErrInvalid)
}

// A store hold (the Redis store found the key's state older than a grant
// it had seen, and holds it back) is quarantined in the catalog until the
// hold ends, so every instance agrees, and counted as a loss once, though
// several allocates read it before the quarantine reached their snapshot.
func TestStoreHoldIsQuarantinedOnce(t *testing.T) {
	e := newEnv(t, key("a", "default", 8), key("b", "default", 8))
	held := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	s := &hookStore{Store: e.store}
	s.afterInspect = func(infos []optimistic.KeyInfo) {
		for i := range infos {
			if infos[i].ID == "a" {
				infos[i].HeldUntil = held
			}
		}
	}
	// The allocates' reads answer together.
	const n = 8
	var entered atomic.Int32
	gate := func() error {
		entered.Add(1)
		deadline := time.Now().Add(2 * time.Second)
		for entered.Load() < n && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		return nil
	}
	s.inspectGate.Store(&gate)
	opts := &broker.Options{Requests: e.requests, Logger: e.log, Losses: broker.NewLosses()}
	b := broker.New(e.cat, s, opts)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			_, err := b.Allocate(t.Context(), req("default"))
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	require.GreaterOrEqual(t, entered.Load(), int32(n), "every allocate read the store")
	l, err := broker.NewAdmin(e.cat, e.store, opts).Losses(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, l.Held)
	require.Equal(t, int64(1), l.Total, "counted once")
	require.True(t, held.Equal(l.Until), "until %v, want %v", l.Until, held)
	require.True(t, held.Equal(e.get(t, "a").QuarantineUntil))
}

// lockedBuffer is a log's buffer, safe for the goroutines that log.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
