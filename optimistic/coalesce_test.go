package optimistic

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/test/redistest"
)

// stall is a go-redis hook that, once armed, holds the next pipeline
// before it is sent until let go, and counts pipelines of transactions
// (not, say, a new connection's handshake).
type stall struct {
	armed     atomic.Bool
	held      chan struct{}
	letGo     chan struct{}
	once      sync.Once
	pipelines atomic.Int64
}

// newStall returns a stall that the test's end lets go, if the test did
// not, so that no pipeline stays held.
func newStall(t *testing.T) *stall {
	h := &stall{held: make(chan struct{}), letGo: make(chan struct{})}
	t.Cleanup(h.release)
	return h
}

func (h *stall) release() { h.once.Do(func() { close(h.letGo) }) }

func (h *stall) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *stall) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *stall) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() == "multi" }) {
			h.pipelines.Add(1)
		}
		if h.armed.CompareAndSwap(true, false) {
			close(h.held)
			<-h.letGo
		}
		return next(ctx, cmds)
	}
}

// queued is how many releases wait for s's next pipeline to c.
func queued(s *Store, c *redis.Client) int {
	s.releases.mu.Lock()
	defer s.releases.mu.Unlock()
	return len(s.releases.queues[c])
}

// stalledStore is a store on addr whose client carries a stall, with keys
// k0…k(n-1) of limit 2 in openai/default, each holding one lease (live
// for a minute) and k0 a second one that expires at once.
func stalledStore(t *testing.T, addr string, n int) (*Store, *redis.Client, *stall, []Lease, Lease) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	h := newStall(t)
	rdb.AddHook(h)
	s := storeOn(t, rdb)
	ctx := t.Context()
	leases := make([]Lease, n)
	for i := range leases {
		id := fmt.Sprintf("k%d", i)
		require.NoError(t, s.SyncKey(ctx, KeyState{ID: id, Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 2}))
		l, _, err := s.Allocate(ctx, AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{id}, TTL: time.Minute})
		require.NoError(t, err)
		leases[i] = l
	}
	expired, _, err := s.Allocate(ctx, AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k0"}, TTL: time.Millisecond})
	require.NoError(t, err)
	time.Sleep(5 * time.Millisecond)
	return s, rdb, h, leases, expired
}

func refsOf(leases []Lease) []LeaseRef {
	refs := make([]LeaseRef, len(leases))
	for i, l := range leases {
		refs[i] = l.LeaseRef
	}
	return refs
}

// releaseAll releases refs at once while the first release's pipeline is
// held on the stall, so that the others queue behind it, and returns each
// one's answer.
func releaseAll(t *testing.T, s *Store, rdb *redis.Client, h *stall, refs []LeaseRef, before func()) []error {
	t.Helper()
	ctx := t.Context()
	errs := make([]error, len(refs))
	h.armed.Store(true)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = s.Release(ctx, refs[0]) })
	<-h.held
	for i := 1; i < len(refs); i++ {
		wg.Go(func() { errs[i] = s.Release(ctx, refs[i]) })
	}
	require.Eventually(t, func() bool { return queued(s, rdb) == len(refs)-1 }, 10*time.Second, time.Millisecond)
	if before != nil {
		before()
	}
	h.release()
	wg.Wait()
	return errs
}

// Releases that come while one is on the wire go out together, in the
// next pipeline, and each gets its own answer: released, unknown,
// mismatched or expired, as a release of its own would have said.
func TestConcurrentReleasesShareAPipeline(t *testing.T) {
	srv := redistest.Start(t)
	s, rdb, h, leases, expired := stalledStore(t, srv.Addr, 20)
	ctx := t.Context()
	refs := []LeaseRef{leases[0].LeaseRef}
	unknown := leases[1].LeaseRef
	unknown.LeaseID = "never-granted"
	mismatch := leases[2].LeaseRef
	mismatch.Pool = "vip"
	refs = append(refs, unknown, mismatch, expired.LeaseRef)
	for _, l := range leases[3:] {
		refs = append(refs, l.LeaseRef)
	}
	start := h.pipelines.Load()
	errs := releaseAll(t, s, rdb, h, refs, nil)
	require.Equal(t, int64(2), h.pipelines.Load()-start, "the first release's pipeline, then one for all the others")

	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], ErrLeaseLost)
	require.ErrorContains(t, errs[1], "unknown")
	require.ErrorIs(t, errs[2], ErrLeaseMismatch)
	require.ErrorIs(t, errs[3], ErrLeaseLost)
	require.ErrorContains(t, errs[3], "expired")
	for i, err := range errs[4:] {
		require.NoError(t, err, "release %d", i+4)
	}
	for i, l := range leases {
		_, err := s.Holds(ctx, l.LeaseRef)
		if i == 1 || i == 2 {
			require.NoError(t, err, "a release that did not match left lease %d alone", i)
			continue
		}
		require.ErrorIs(t, err, ErrLeaseLost, "lease %d released", i)
	}
	require.Eventually(t, func() bool {
		s.releases.mu.Lock()
		defer s.releases.mu.Unlock()
		return len(s.releases.queues) == 0
	}, 10*time.Second, time.Millisecond, "nothing stays behind once idle")
}

// Releases queued for a server that cannot be reached all fail, none
// reported done, and none happened: the leases still hold.
func TestUnreachableServerFailsEveryQueuedRelease(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	s, rdb, h, leases, _ := stalledStore(t, proxy.Addr, 8)
	refs := refsOf(leases)
	errs := releaseAll(t, s, rdb, h, refs, func() { proxy.SetDown(true) })
	for i, err := range errs {
		require.ErrorIs(t, err, ErrStore, "release %d", i)
	}
	proxy.SetDown(false)
	for i, l := range leases {
		_, err := s.Holds(t.Context(), l.LeaseRef)
		require.NoError(t, err, "lease %d", i)
	}
}

// A pipeline of releases that the server ran but whose replies the
// network lost fails every release in it (ErrStore: the outcome is
// unknown), and is not sent again: a second run would find the leases
// gone and report them unknown, as if never held.
func TestCutPipelineIsNotSentAgain(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	s, rdb, h, leases, _ := stalledStore(t, proxy.Addr, 8)
	refs := refsOf(leases)
	// Only the second pipeline, which carries every release but the
	// first, names lease 1.
	errs := releaseAll(t, s, rdb, h, refs, func() { proxy.CutNextReply(member(refs[1])) })
	require.Equal(t, 1, proxy.Cuts())
	require.NoError(t, errs[0])
	for i, err := range errs[1:] {
		require.ErrorIs(t, err, ErrStore, "release %d", i+1)
		require.NotErrorIs(t, err, ErrLeaseLost, "release %d", i+1)
	}
	for i, l := range leases {
		_, err := s.Holds(t.Context(), l.LeaseRef)
		require.ErrorIs(t, err, ErrLeaseLost, "lease %d: the server ran its release", i)
	}
}

// A caller whose ctx ends while its release waits for the next pipeline
// gets ctx's error at once; the release may still go out (as one cut
// short on the wire may have), and here it does.
func TestReleaseQueuedPastItsContext(t *testing.T) {
	srv := redistest.Start(t)
	s, rdb, h, leases, _ := stalledStore(t, srv.Addr, 2)
	ctx := t.Context()
	h.armed.Store(true)
	first := make(chan error, 1)
	go func() { first <- s.Release(ctx, leases[0].LeaseRef) }()
	<-h.held
	cctx, cancel := context.WithCancel(ctx)
	second := make(chan error, 1)
	go func() { second <- s.Release(cctx, leases[1].LeaseRef) }()
	require.Eventually(t, func() bool { return queued(s, rdb) == 1 }, 10*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-second, context.Canceled)
	h.release()
	require.NoError(t, <-first)
	require.Eventually(t, func() bool {
		_, err := s.Holds(ctx, leases[1].LeaseRef)
		return err != nil
	}, 10*time.Second, time.Millisecond, "the queued release went out with the next pipeline")
}

// A release whose caller's ctx ended while it was queued still wakes the
// caller waiting here for its slot once it goes out, not a poll later.
func TestQueuedReleaseWakesAWaiter(t *testing.T) {
	srv := redistest.Start(t)
	s, rdb, h, leases, _ := stalledStore(t, srv.Addr, 1)
	ctx := t.Context()
	req := AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"w"}, TTL: time.Minute}
	require.NoError(t, s.SyncKey(ctx, KeyState{ID: "w", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 1}))
	held, _, err := s.Allocate(ctx, req)
	require.NoError(t, err)
	waited := make(chan error, 1)
	go func() {
		wreq := req
		wreq.Wait = time.Minute
		_, _, err := s.Allocate(ctx, wreq)
		waited <- err
	}()
	require.Eventually(t, func() bool { return parked(s) == 1 && subscribed(s, "w") }, 10*time.Second, time.Millisecond)

	h.armed.Store(true)
	go func() { _ = s.Release(ctx, leases[0].LeaseRef) }()
	<-h.held
	cctx, cancel := context.WithCancel(ctx)
	released := make(chan error, 1)
	go func() { released <- s.Release(cctx, held.LeaseRef) }()
	require.Eventually(t, func() bool { return queued(s, rdb) == 1 }, 10*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-released, context.Canceled)
	h.release()
	select {
	case err := <-waited:
		require.NoError(t, err)
	case <-time.After(WaitPoll / 2):
		t.Fatal("the waiter was left for the poll: the release did not wake it")
	}
}
