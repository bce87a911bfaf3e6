package optimistic

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	rs "github.com/credpool/credpool/internal/redisschema"
	"github.com/credpool/credpool/test/redistest"
)

// waiter is a waiting Allocate of key k running in the background.
type waiter struct {
	done   chan allocated
	cancel context.CancelFunc
}

// startWaiter starts a waiting Allocate of k on s and returns once it is
// parked in line, having found k full: the n-th caller parked there.
func startWaiter(t *testing.T, s *Store, n int) waiter {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	w := waiter{done: make(chan allocated, 1), cancel: cancel}
	go func() {
		l, st, err := s.Allocate(ctx, waitReq(time.Minute))
		w.done <- allocated{lease: l, stats: st, err: err, pool: "default"}
	}()
	require.Eventually(t, func() bool { return parked(s) == n && subscribed(s, "k") }, 10*time.Second, time.Millisecond)
	return w
}

func (w waiter) result(t *testing.T) allocated {
	t.Helper()
	select {
	case got := <-w.done:
		return got
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting caller was not served")
		return allocated{}
	}
}

// primed returns a lease of k held in s, which takes k's last free slot,
// and a caller of s waiting for k, with s ready to hand the slot over: a
// first release, whose waiter took the slot itself, heard that s alone
// listens for k. Fences stay fresh for a minute, so that a slow machine
// does not turn the handoff down.
func primed(t *testing.T, s *Store) (Lease, waiter) {
	t.Helper()
	s.fenceFresh = time.Minute
	held, _, err := s.Allocate(t.Context(), waitReq(0))
	require.NoError(t, err)
	_, _, err = s.Allocate(t.Context(), waitReq(0))
	require.ErrorIs(t, err, ErrNoCapacity)
	first := startWaiter(t, s, 1)
	second := startWaiter(t, s, 2)
	require.NoError(t, s.Release(t.Context(), held.LeaseRef))
	got := first.result(t)
	require.NoError(t, got.err)
	require.NotZero(t, got.stats.Attempts, "the first waiter took the freed slot itself")
	require.Eventually(t, func() bool { return parked(s) == 1 }, 10*time.Second, time.Millisecond)
	require.True(t, s.notices.alone("k"))
	return got.lease, second
}

// A release hands its slot to the caller waiting in this process, in its
// own MULTI: the caller reads and commits nothing, and gets a lease of its
// own with a later fence.
func TestReleaseHandsSlotToWaiter(t *testing.T) {
	_, s := waitStores(t, false)
	ctx := t.Context()
	held, w := primed(t, s)
	require.NoError(t, s.Release(ctx, held.LeaseRef))
	got := w.result(t)
	require.NoError(t, got.err)
	require.Zero(t, got.stats.Attempts, "handed over, not taken")
	require.Greater(t, got.lease.Fence, held.Fence)
	require.NotEqual(t, held.LeaseID, got.lease.LeaseID)
	until, err := s.Holds(ctx, got.lease.LeaseRef)
	require.NoError(t, err)
	require.WithinDuration(t, got.lease.Until, until, time.Millisecond)
	infos, err := s.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, 1, infos[0].Live)
	require.ErrorIs(t, s.Release(ctx, held.LeaseRef), ErrLeaseLost, "the released lease is gone")
	require.NoError(t, s.Release(ctx, got.lease.LeaseRef))
}

// A handoff that the key no longer allows (disabled, its limit lowered
// below the leases it holds, deleted) grants nothing: the caller's lease
// is deleted, and the caller, woken, finds out for itself.
func TestRefusedHandoffLeavesNothing(t *testing.T) {
	for _, c := range []struct {
		name string
		// change writes Redis directly, sending no notice that would
		// wake the waiter: the handoff alone meets it.
		change func(ctx context.Context, rdb redis.UniversalClient, keys rs.Schema) error
		live   int
	}{
		{"disabled", func(ctx context.Context, rdb redis.UniversalClient, keys rs.Schema) error {
			return rdb.HSet(ctx, keys.Key("k"), rs.FieldStatus, string(StatusDisabled)).Err()
		}, 1},
		{"limit lowered", func(ctx context.Context, rdb redis.UniversalClient, keys rs.Schema) error {
			return rdb.HSet(ctx, keys.Key("k"), rs.FieldLimit, 1).Err()
		}, 1},
		{"deleted", func(ctx context.Context, rdb redis.UniversalClient, keys rs.Schema) error {
			records := rdb.Keys(ctx, keys.Key("k")+":lease:*").Val()
			return rdb.Del(ctx, append(records, keys.Key("k"), keys.Leases("k"))...).Err()
		}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.Start(t)
			rdb := srv.Client(t)
			other, s := storeOn(t, redis.NewClient(&redis.Options{Addr: srv.Addr})), storeOn(t, redis.NewClient(&redis.Options{Addr: srv.Addr}))
			ctx := t.Context()
			// One of the two slots is another process's: the handoff's
			// own count then decides when the limit is lowered.
			require.NoError(t, other.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 2}))
			kept, _, err := other.Allocate(ctx, waitReq(0))
			require.NoError(t, err)
			held, w := primed(t, s)
			require.NoError(t, c.change(ctx, rdb, s.keys))
			require.True(t, s.notices.alone("k"))

			_ = s.Release(ctx, held.LeaseRef)
			require.Contains(t, rdb.Info(ctx, "commandstats").Val(), "cmdstat_pubsub|shardnumsub", "a handoff was tried")
			leases := func() int64 { return rdb.ZCard(ctx, s.keys.Leases("k")).Val() }
			require.Eventually(t, func() bool { return leases() == int64(c.live) }, 10*time.Second, time.Millisecond,
				"only the other process's lease is left")
			require.Eventually(t, func() bool { return parked(s) == 1 }, 10*time.Second, time.Millisecond, "the waiter waits on")
			select {
			case got := <-w.done:
				t.Fatalf("the waiter got %+v", got)
			default:
			}
			records := srv.Find(t, ":lease:")
			require.Len(t, records, c.live, "no record but the other process's: %v", records)
			if c.live == 0 {
				require.Zero(t, rdb.Exists(ctx, s.keys.Key("k")).Val(), "no key HASH made by the handoff")
			} else {
				require.Contains(t, records[0], kept.LeaseID)
			}
			w.cancel()
			require.ErrorIs(t, w.result(t).err, context.Canceled)
		})
	}
}

// A caller whose ctx ended while a release was handing it a slot takes
// nothing: the slot goes back, and the call returns ctx's error.
func TestHandoffToLeavingCallerGoesBack(t *testing.T) {
	_, s := waitStores(t, false)
	ctx := t.Context()
	held, w := primed(t, s)
	h := s.queue.claim("k", "openai", "default")
	require.NotNil(t, h)
	w.cancel()
	// Its wait ended, but it waits for the handoff it was promised.
	require.Eventually(t, func() bool { return parked(s) == 0 }, 10*time.Second, time.Millisecond)
	require.NoError(t, s.handOver(ctx, s.rdb.(*redis.Client), held.LeaseRef, h))
	got := w.result(t)
	require.ErrorIs(t, got.err, context.Canceled)
	require.True(t, h.ok, "the slot was handed over")
	infos, err := s.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Zero(t, infos[0].Live, "and given back")
}

// When the reply of a handoff's MULTI is lost, the release's outcome is
// unknown to its caller, and the waiting caller's lease, landed or not, is
// deleted before the caller tries for itself: it ends with the one slot.
func TestLostReplyOfAHandoff(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	s := storeOn(t, redis.NewClient(&redis.Options{Addr: proxy.Addr, DialerRetries: 1}))
	ctx := t.Context()
	require.NoError(t, s.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 1}))
	held, w := primed(t, s)
	proxy.CutNextExec()
	require.Error(t, s.Release(ctx, held.LeaseRef))
	require.Equal(t, 1, proxy.Cuts())
	got := w.result(t)
	require.NoError(t, got.err)
	require.NotZero(t, got.stats.Attempts, "it took the slot itself")
	infos, err := s.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, 1, infos[0].Live)
	require.Len(t, srv.Find(t, ":lease:"), 1)
}

// A key whose last fence is not fresh by the store's clock (a HASH made
// again, without one, or no grant but handoffs for a while) is handed
// nothing: the caller takes the slot itself, with a fence by the clock,
// above every one given before. One that is fresh is handed on. A
// process whose own last fence seen is stale does not even try. (A HASH
// whose grant count is lower than this process saw is a loss, held back:
// see TestHandoffOnALossIsRefused.)
func TestStaleFenceIsNotHandedOn(t *testing.T) {
	for _, c := range []struct {
		name          string
		age           time.Duration // of the fence, -1: none
		tried, handed bool
	}{
		{"no fence", -1, true, false},
		{"fresh", 5 * time.Second, true, true},
		{"stale", 20 * time.Second, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, s := waitStores(t, false)
			ctx := t.Context()
			held, w := primed(t, s)
			s.fenceFresh = 10 * time.Second
			fence := int64(0)
			if c.age > 0 {
				fence = s.rdb.Time(ctx).Val().Add(-c.age).UnixMicro()
				require.NoError(t, s.rdb.HSet(ctx, s.keys.Key("k"), rs.FieldFence, fence).Err())
				s.fences.forget("k")
				s.fences.saw("k", fence)
			} else {
				require.NoError(t, s.rdb.HDel(ctx, s.keys.Key("k"), rs.FieldFence).Err())
			}
			require.NoError(t, s.Release(ctx, held.LeaseRef))
			tried := strings.Contains(s.rdb.Info(ctx, "commandstats").Val(), "cmdstat_pubsub|shardnumsub")
			require.Equal(t, c.tried, tried, "a handoff was tried")
			got := w.result(t)
			require.NoError(t, got.err)
			if c.handed {
				require.Zero(t, got.stats.Attempts, "handed over")
				require.Equal(t, fence+1, got.lease.Fence)
				return
			}
			require.NotZero(t, got.stats.Attempts, "it took the slot itself")
			require.Greater(t, got.lease.Fence, held.Fence)
		})
	}
}

// A handoff whose lease would not last about its TTL by the server's
// clock (this host's idea of that clock is off) is refused.
func TestHandoffOffTheClockIsRefused(t *testing.T) {
	_, s := waitStores(t, false)
	ctx := t.Context()
	held, w := primed(t, s)
	node := s.rdb.(*redis.Client)
	now, ok := s.clock.now(node)
	require.True(t, ok)
	s.clock.m.Store(node, storeTime{ms: now - time.Minute.Milliseconds(), at: time.Now()})
	require.NoError(t, s.Release(ctx, held.LeaseRef))
	got := w.result(t)
	require.NoError(t, got.err)
	require.NotZero(t, got.stats.Attempts, "it took the slot itself")
	until, err := s.Holds(ctx, got.lease.LeaseRef)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(time.Minute), until, 10*time.Second)
}

// A refused handoff whose caller does not try (its ctx ended) wakes the
// next caller in line for the slot the release freed, without waiting for
// the poll.
func TestRefusedHandoffWakesTheNext(t *testing.T) {
	_, s := waitStores(t, false)
	ctx := t.Context()
	held, first := primed(t, s)
	// Polling, next would ask again no sooner than WaitPoll/2 after this.
	start := time.Now()
	next := startWaiter(t, s, 2)
	h := s.queue.claim("k", "openai", "default")
	require.NotNil(t, h)
	first.cancel()
	require.Eventually(t, func() bool { return parked(s) == 1 }, 10*time.Second, time.Millisecond)
	require.NoError(t, s.rdb.HDel(ctx, s.keys.Key("k"), rs.FieldFence).Err())
	require.NoError(t, s.handOver(ctx, s.rdb.(*redis.Client), held.LeaseRef, h))
	require.ErrorIs(t, first.result(t).err, context.Canceled)
	got := next.result(t)
	require.NoError(t, got.err)
	require.Less(t, time.Since(start), WaitPoll/2, "left for the poll")
}

// A slot another process frees while the only caller in line here is
// being handed a slot (a release claimed its handoff) passes that caller
// over and finds nobody else to wake. A caller that lines up behind it
// meanwhile gets that wake-up once the served caller settles, instead of
// waiting in line for its poll with a slot free.
func TestWakeUpMissedByAServedCallerGoesOnBehindIt(t *testing.T) {
	other, s := waitStores(t, false)
	ctx := t.Context()
	require.NoError(t, other.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 2}))
	kept, _, err := other.Allocate(ctx, waitReq(0))
	require.NoError(t, err)
	held, w := primed(t, s)

	// A release in s is handing w a slot (as Store.release does).
	h := s.queue.claim("k", "openai", "default")
	require.NotNil(t, h)

	// Meanwhile the other process frees its slot: its notice reaches s,
	// and wakes nobody.
	s.notes.skipped("k")
	require.NoError(t, other.Release(ctx, kept.LeaseRef))
	require.Eventually(t, func() bool { return !skipNoted(s, "k") }, 10*time.Second, time.Millisecond, "the notice arrived")

	start := time.Now()
	x := make(chan allocated, 1)
	go func() {
		l, st, err := s.Allocate(ctx, waitReq(time.Minute))
		x <- allocated{lease: l, stats: st, err: err}
	}()
	// In line behind w.
	require.Eventually(t, func() bool { return len(x) == 1 || parked(s) == 2 }, 10*time.Second, time.Millisecond)

	// The handoff completes: w is served and leaves.
	require.NoError(t, s.handOver(ctx, s.rdb.(*redis.Client), held.LeaseRef, h))
	require.NoError(t, w.result(t).err)

	select {
	case got := <-x:
		require.NoError(t, got.err)
		require.Less(t, time.Since(start), WaitPoll/2,
			"the newcomer waited for its poll with a slot free (waited %v)", got.stats.Waited)
	case <-time.After(10 * time.Second):
		t.Fatal("the newcomer was not served")
	}
}
