package optimistic

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/test/redistest"
)

// waitStores returns two stores on one server, each with its own client,
// as two processes have, and one key "k" of limit 1 in openai/default.
func waitStores(t *testing.T, cluster bool) (a, b *Store) {
	t.Helper()
	var addr string
	if cluster {
		addr = redistest.StartCluster(t).Addr
	} else {
		addr = redistest.Start(t).Addr
	}
	open := func() *Store {
		if cluster {
			return storeOn(t, redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}}))
		}
		return storeOn(t, redis.NewClient(&redis.Options{Addr: addr}))
	}
	a, b = open(), open()
	require.NoError(t, a.SyncKey(t.Context(), KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 1}))
	return a, b
}

// storeOn returns a store on rdb, which the test's end closes.
func storeOn(t *testing.T, rdb redis.UniversalClient) *Store {
	t.Helper()
	t.Cleanup(func() { _ = rdb.Close() })
	s, err := New(rdb, nil)
	require.NoError(t, err)
	return s
}

func waitReq(wait time.Duration) AllocateRequest {
	return AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute, Wait: wait}
}

// A release by another process wakes a caller waiting here through the
// key's channel, not the poll: the wake-up itself arrives.
func TestAwaitWokenByAnotherProcess(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		name := map[bool]string{false: "standalone", true: "cluster"}[cluster]
		t.Run(name, func(t *testing.T) {
			a, b := waitStores(t, cluster)
			ctx := t.Context()
			held, _, err := a.Allocate(ctx, waitReq(0))
			require.NoError(t, err)
			p, err := b.Await(ctx, []string{"k"})
			require.NoError(t, err)
			defer p.Leave()
			// Await stops waiting for the confirmation after a while; a
			// loaded machine may take longer, and a notice sent before it
			// is lost (the poll would cover it, not this test).
			require.Eventually(t, func() bool { return subscribed(b, "k") }, 10*time.Second, time.Millisecond)
			b.notes.skipped("k")
			require.NoError(t, a.Release(ctx, held.LeaseRef))
			select {
			case id := <-p.wake:
				require.Equal(t, "k", id)
				require.False(t, skipNoted(b, "k"), "the notice ended the skip note")
			case <-time.After(10 * time.Second):
				t.Fatal("no wake-up from the other store's release")
			}
		})
	}
}

// A waiting Allocate gets the slot a release frees, in this process or
// another, and reports the time it waited.
func TestAllocateWaitsForRelease(t *testing.T) {
	a, b := waitStores(t, false)
	ctx := t.Context()
	for _, releaser := range []*Store{b, a} {
		held, _, err := b.Allocate(ctx, waitReq(0))
		require.NoError(t, err)
		type result struct {
			lease Lease
			st    Stats
			err   error
		}
		done := make(chan result, 1)
		go func() {
			l, st, err := b.Allocate(ctx, waitReq(time.Minute))
			done <- result{l, st, err}
		}()
		require.Eventually(t, func() bool { return b.Waiting() == 1 }, 10*time.Second, time.Millisecond)
		require.NoError(t, releaser.Release(ctx, held.LeaseRef))
		r := <-done
		require.NoError(t, r.err)
		require.Equal(t, "k", r.lease.KeyID)
		require.NoError(t, b.Release(ctx, r.lease.LeaseRef))
	}
	require.Empty(t, b.notices.subs, "nobody waits: no subscription left")
	require.Nil(t, b.notices.shared)
}

// A wait that ends is the pool full; one cancelled by ctx is ctx's error,
// and either way nothing is taken or left behind.
func TestAllocateWaitEnds(t *testing.T) {
	a, b := waitStores(t, false)
	ctx := t.Context()
	held, _, err := a.Allocate(ctx, waitReq(0))
	require.NoError(t, err)

	_, _, err = b.Allocate(ctx, waitReq(30*time.Millisecond))
	require.ErrorIs(t, err, ErrNoCapacity)

	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, _, err := b.Allocate(cctx, waitReq(time.Minute))
		done <- err
	}()
	require.Eventually(t, func() bool { return b.Waiting() == 1 }, 10*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.NoError(t, a.Release(ctx, held.LeaseRef))

	infos, err := a.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Zero(t, infos[0].Live, "the cancelled waiter took no slot")
	require.Zero(t, b.Waiting())
	require.Empty(t, b.notices.subs)
}

// Callers of one process that wait are served in the order they came,
// whatever the order of the releases.
func TestWaitersServedInArrivalOrder(t *testing.T) {
	_, s := waitStores(t, false)
	ctx := t.Context()
	held, _, err := s.Allocate(ctx, waitReq(0))
	require.NoError(t, err)
	const n = 5
	grants := make(chan int, n)
	leases := make([]Lease, n)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			l, _, err := s.Allocate(ctx, waitReq(time.Minute))
			if err != nil {
				errs <- err
				return
			}
			leases[i] = l
			grants <- i
		}()
		// Parked, having found the key full, before the next one comes.
		require.Eventually(t, func() bool { return parked(s) == i+1 }, 10*time.Second, time.Millisecond)
	}
	for i := range n {
		require.NoError(t, s.Release(ctx, held.LeaseRef))
		select {
		case got := <-grants:
			require.Equal(t, i, got, "served out of turn")
			held = leases[got]
		case err := <-errs:
			t.Fatal(err)
		}
	}
	require.NoError(t, s.Release(ctx, held.LeaseRef))
}

// Many callers in one or two processes cycling allocate (waiting), hold,
// release on a key of limit 2: never more holders than the limit, never a
// fence twice, and everyone is served.
func TestWaitingNeverOversells(t *testing.T) {
	a, b := waitStores(t, false)
	ctx := t.Context()
	require.NoError(t, a.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 2}))
	for _, c := range []struct {
		name   string
		stores []*Store
	}{{"one process", []*Store{a}}, {"two processes", []*Store{a, b}}} {
		stores := c.stores
		t.Run(c.name, func(t *testing.T) {
			var (
				mu      sync.Mutex
				holders int
				most    int
				fences  = map[int64]int{}
			)
			cycle(t, stores, 16, 10, func(_ *Store, l Lease) func() {
				mu.Lock()
				defer mu.Unlock()
				holders++
				most = max(most, holders)
				fences[l.Fence]++
				return func() {
					mu.Lock()
					defer mu.Unlock()
					holders--
				}
			})
			require.LessOrEqual(t, most, 2)
			require.Len(t, fences, 16*10, "a fence handed out twice")
		})
	}
}

// cycle runs callers spread over stores, each allocating k (waiting),
// holding it a millisecond and releasing it, rounds times. got runs at
// each grant, and what it returns when the hold ends.
func cycle(t *testing.T, stores []*Store, callers, rounds int, got func(s *Store, l Lease) (held func())) {
	t.Helper()
	ctx := t.Context()
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		s := stores[i%len(stores)]
		wg.Go(func() {
			for range rounds {
				l, _, err := s.Allocate(ctx, waitReq(30*time.Second))
				if err != nil {
					errs <- err
					return
				}
				held := got(s, l)
				time.Sleep(time.Millisecond)
				held()
				if err := s.Release(ctx, l.LeaseRef); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

func TestWaitNegativeIsInvalid(t *testing.T) {
	_, s := waitStores(t, false)
	_, _, err := s.Allocate(t.Context(), waitReq(-time.Second))
	require.True(t, errors.Is(err, ErrInvalid), "got %v", err)
}

// Waiting callers hold no pooled connection: with far more of them than
// the pool has connections, the store's other calls still get one.
func TestWaitersHoldNoPooledConnection(t *testing.T) {
	srv := redistest.Start(t)
	s := storeOn(t, redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 2, PoolTimeout: 200 * time.Millisecond}))
	ctx := t.Context()
	require.NoError(t, s.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 1}))
	held, _, err := s.Allocate(ctx, waitReq(0))
	require.NoError(t, err)
	const waiters = 8
	done := make(chan error, waiters)
	for range waiters {
		go func() {
			l, _, err := s.Allocate(ctx, waitReq(time.Minute))
			if err == nil {
				err = s.Release(ctx, l.LeaseRef)
			}
			done <- err
		}()
	}
	require.Eventually(t, func() bool { return s.Waiting() == waiters }, 10*time.Second, time.Millisecond)
	for range 3 {
		_, err := s.Inspect(ctx, "k")
		require.NoError(t, err, "a pooled connection must be free while %d callers wait", waiters)
	}
	require.NoError(t, s.Release(ctx, held.LeaseRef))
	for range waiters {
		require.NoError(t, <-done)
	}
}

// Waiting callers fill every slot of a key at once: a caller waits only
// behind others that found it full, not behind others still trying.
func TestWaitersFillEverySlot(t *testing.T) {
	_, s := waitStores(t, false)
	ctx := t.Context()
	require.NoError(t, s.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 3}))
	type grant struct {
		lease Lease
		st    Stats
		err   error
	}
	const callers = 10
	grants := make(chan grant, callers)
	for range callers {
		go func() {
			l, st, err := s.Allocate(ctx, waitReq(time.Minute))
			grants <- grant{l, st, err}
		}()
	}
	var held []Lease
	for range 3 {
		g := <-grants
		require.NoError(t, g.err)
		require.Zero(t, g.st.Waited, "a slot was free: the first three never wait")
		held = append(held, g.lease)
	}
	require.Eventually(t, func() bool { return s.Waiting() == callers-3 }, 10*time.Second, time.Millisecond)
	// Each release hands its slot to the next caller in line.
	for range callers - 3 {
		require.NoError(t, s.Release(ctx, held[0].LeaseRef))
		g := <-grants
		require.NoError(t, g.err)
		held = append(held[1:], g.lease)
	}
	for _, l := range held {
		require.NoError(t, s.Release(ctx, l.LeaseRef))
	}
}

// subscribed reports whether Redis confirmed s's subscription to id's
// free-slot channel.
func subscribed(s *Store, id string) bool {
	s.notices.mu.Lock()
	defer s.notices.mu.Unlock()
	sub := s.notices.subs[id]
	if sub == nil {
		return false
	}
	select {
	case <-sub.ready:
		return true
	default:
		return false
	}
}

// Slots freed at once, by a limit raised in another process, reach every
// caller waiting for them: the sync's notice wakes them all, not one.
func TestRaisedLimitServesEveryWaiter(t *testing.T) {
	a, b := waitStores(t, false)
	ctx := t.Context()
	_, _, err := b.Allocate(ctx, waitReq(0))
	require.NoError(t, err)
	const waiters = 4
	done := make(chan error, waiters)
	for range waiters {
		go func() {
			_, _, err := b.Allocate(ctx, waitReq(time.Minute))
			done <- err
		}()
	}
	require.Eventually(t, func() bool { return b.Waiting() == waiters && subscribed(b, "k") }, 10*time.Second, time.Millisecond)
	require.NoError(t, a.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 1 + waiters}))
	deadline := time.After(WaitPoll / 2)
	for range waiters {
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-deadline:
			t.Fatal("a waiter was left for the poll: the freed slots were not handed on")
		}
	}
}

// parked counts the callers of s parked in line: found the key full (or
// waiting for their turn) and asleep.
func parked(s *Store) int {
	s.queue.mu.Lock()
	defer s.queue.mu.Unlock()
	seen := map[*Place]bool{}
	for _, line := range s.queue.lines {
		for _, p := range line {
			if p.parked {
				seen[p] = true
			}
		}
	}
	return len(seen)
}

// A waiting call that finds a free slot while nobody waits takes it
// without listening for notices: no subscription, no extra connection.
func TestWaitingCallWithRoomSubscribesNothing(t *testing.T) {
	a, _ := waitStores(t, false)
	ctx := t.Context()
	for range 5 {
		l, _, err := a.Allocate(ctx, waitReq(time.Minute))
		require.NoError(t, err)
		require.NoError(t, a.Release(ctx, l.LeaseRef))
	}
	stats, err := a.rdb.Info(ctx, "commandstats").Result()
	require.NoError(t, err)
	require.NotContains(t, stats, "cmdstat_ssubscribe")
}

// A notice lost with its connection (the network to the server cut while
// a caller waits, and the release made meanwhile) costs the waiter a poll,
// not the slot: it still gets the lease.
func TestWaiterSurvivesCutSubscription(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	a, err := New(srv.Client(t), nil)
	require.NoError(t, err)
	b := storeOn(t, redis.NewClient(&redis.Options{Addr: proxy.Addr}))
	ctx := t.Context()
	require.NoError(t, a.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 1}))
	held, _, err := a.Allocate(ctx, waitReq(0))
	require.NoError(t, err)
	type result struct {
		lease Lease
		err   error
	}
	done := make(chan result, 1)
	go func() {
		l, _, err := b.Allocate(ctx, waitReq(time.Minute))
		done <- result{l, err}
	}()
	require.Eventually(t, func() bool { return parked(b) == 1 && subscribed(b, "k") }, 10*time.Second, time.Millisecond)
	proxy.SetDown(true)
	require.NoError(t, a.Release(ctx, held.LeaseRef)) // its notice finds no listener
	proxy.SetDown(false)
	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, "k", r.lease.KeyID)
	infos, err := a.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, 1, infos[0].Live)
}

// Every try of a waiting call is marked WithWaiting, the first (before it
// joins the line) too, and so is every try of Place.Retry.
func TestWaitingTriesAreMarked(t *testing.T) {
	s := keyStore(t, redistest.Start(t).Client(t), nil)
	var marks []bool
	_, _, err := AllocateWaiting(t.Context(), s, waitReq(30*time.Millisecond), func(ctx context.Context, req AllocateRequest) (Lease, Stats, error) {
		marks = append(marks, IsWaiting(ctx))
		return Lease{}, Stats{}, &CapacityError{}
	})
	require.ErrorIs(t, err, ErrNoCapacity)
	require.GreaterOrEqual(t, len(marks), 2, "the first try, and one in line")
	require.NotContains(t, marks, false)

	// A caller's own loop around Await and Retry.
	p, err := s.Await(t.Context(), []string{"k"})
	require.NoError(t, err)
	defer p.Leave()
	var retried []bool
	err = p.Retry(t.Context(), time.Now().Add(30*time.Millisecond), func(ctx context.Context) error {
		retried = append(retried, IsWaiting(ctx))
		return &CapacityError{}
	})
	require.ErrorIs(t, err, ErrNoCapacity)
	require.NotEmpty(t, retried)
	require.NotContains(t, retried, false, "Retry's tries")
}

// A wake-up goes to the first caller in line on the key, whether or not
// that caller can use the key (Allocate skips candidates of other pools;
// a key may also move to another pool while callers wait on it). That
// caller tries, finds nothing for itself, and parks again, having spent
// the wake-up. The caller behind it, which could use the slot, asks the
// store again at its poll (WaitPoll), as every caller in line does, and
// not only at the end of its wait.
func TestWakeSpentOnACallerThatCannotUseTheKeyCostsAPoll(t *testing.T) {
	other, s := waitStores(t, false) // "k": openai/default, limit 1
	ctx := t.Context()
	require.NoError(t, other.SyncKey(ctx, KeyState{ID: "v", Provider: "openai", Pool: "vip", Status: StatusAvailable, MaxConcurrentUses: 1}))
	heldK, _, err := other.Allocate(ctx, waitReq(0))
	require.NoError(t, err)
	_, _, err = other.Allocate(ctx, AllocateRequest{Provider: "openai", Pool: "vip", Candidates: []string{"v"}, TTL: time.Minute})
	require.NoError(t, err)

	// A, of pool vip, lists "k" among its candidates (not its pool: skipped).
	aDone := make(chan error, 1)
	go func() {
		_, _, err := s.Allocate(ctx, AllocateRequest{Provider: "openai", Pool: "vip", Candidates: []string{"k", "v"}, TTL: time.Minute, Wait: time.Minute})
		aDone <- err
	}()
	require.Eventually(t, func() bool { return parked(s) == 1 && subscribed(s, "k") }, 10*time.Second, time.Millisecond)

	// B, of pool default, waits for "k" behind A.
	const wait = 4 * WaitPoll
	bDone := make(chan allocated, 1)
	go func() {
		l, st, err := s.Allocate(ctx, waitReq(wait))
		bDone <- allocated{lease: l, stats: st, err: err}
	}()
	require.Eventually(t, func() bool { return parked(s) == 2 }, 10*time.Second, time.Millisecond)

	require.NoError(t, other.Release(ctx, heldK.LeaseRef))
	freed := time.Now()
	select {
	case got := <-bDone:
		require.NoError(t, got.err)
		require.Less(t, time.Since(freed), WaitPoll+500*time.Millisecond, "B was served only at the end of its wait")
	case <-time.After(2 * wait):
		t.Fatal("B was not served")
	}
	select {
	case err := <-aDone:
		t.Fatalf("A ended: %v", err)
	default:
	}
}
