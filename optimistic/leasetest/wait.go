package leasetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/optimistic"
)

// waitReq asks for k, waiting up to wait for a slot.
func waitReq(wait time.Duration) optimistic.AllocateRequest {
	return optimistic.AllocateRequest{Provider: provider, Pool: pool, Candidates: []string{"k"}, TTL: longTTL, Wait: wait}
}

// waits checks AllocateRequest.Wait: a store that is a Waiter hands a
// waiting caller the slot a release frees, whether this process or
// another released it; one that is not refuses to wait.
func waits(t *testing.T, b Backend) {
	syncKeys(t, b, key("k", 1))
	ctx := context.Background()
	w, ok := b.Store.(optimistic.Waiter)
	if !ok {
		_, _, err := b.Store.Allocate(ctx, waitReq(time.Second))
		require.ErrorIs(t, err, optimistic.ErrInvalid, "a store that cannot wait must say so")
		return
	}
	peer := b.Peer(t)
	for _, releaser := range []optimistic.LeaseStore{b.Store, peer} {
		held, err := allocate(b, longTTL, "k")
		require.NoError(t, err)
		done := make(chan error, 1)
		var got optimistic.Lease
		go func() {
			var err error
			got, _, err = b.Store.Allocate(ctx, waitReq(time.Minute))
			done <- err
		}()
		// Released once the caller is in line (it joins only after
		// finding k full): whether it tries again before or after the
		// release, it must end up with the slot.
		require.Eventually(t, func() bool { return w.Waiting() == 1 }, 10*time.Second, time.Millisecond)
		require.NoError(t, releaser.Release(ctx, held.LeaseRef))
		require.NoError(t, <-done)
		require.Equal(t, "k", got.KeyID)
		require.NotEqual(t, held.LeaseID, got.LeaseID)
		require.NoError(t, b.Store.Release(ctx, got.LeaseRef))
	}
}

// waitEnds checks that a wait that runs out is the pool full, and one
// cancelled by ctx is ctx's error and takes no slot, even when one frees
// up right after.
func waitEnds(t *testing.T, b Backend) {
	syncKeys(t, b, key("k", 1))
	w, ok := b.Store.(optimistic.Waiter)
	if !ok {
		return
	}
	ctx := context.Background()
	held := mustAllocate(t, b, longTTL, "k")
	start := time.Now()
	_, _, err := b.Store.Allocate(ctx, waitReq(50*time.Millisecond))
	require.ErrorIs(t, err, optimistic.ErrNoCapacity)
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond, "full before the wait ended")

	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, _, err := b.Store.Allocate(cctx, waitReq(time.Minute))
		done <- err
	}()
	require.Eventually(t, func() bool { return w.Waiting() == 1 }, 10*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.NoError(t, b.Store.Release(ctx, held.LeaseRef))
	require.Zero(t, w.Waiting())
	require.Zero(t, info(t, b, "k").Live, "a cancelled waiter holds no slot")
}

// expiryWakes checks that slots freed by expiry reach the callers in line
// together: nobody announces an expiry, so the grant that prunes expired
// leases wakes a caller in line for each slot it left free, instead of
// leaving them to find the slots one poll at a time.
func expiryWakes(t *testing.T, b Backend) {
	w, ok := b.Store.(optimistic.Waiter)
	if !ok {
		return
	}
	syncKeys(t, b, key("k", 4))
	var last optimistic.Lease
	for range 4 {
		last = mustAllocate(t, b, shortTTL, "k")
	}
	line := lineUp(t, w, 4)
	waitPast(last.Until)
	_, st, err := b.Store.Allocate(context.Background(), waitReq(0))
	require.NoError(t, err)
	require.Equal(t, 4, st.Pruned)
	requireWoken(t, line[:3])
}

// expiryWakesOthers is expiryWakes with the grant made by a caller first
// in line (a try of Place.Retry, as a waiting Allocate's are): the slots
// it left free wake the callers behind it, not itself, which has its
// slot and would pass a wake-up on only when it leaves.
func expiryWakesOthers(t *testing.T, b Backend) {
	w, ok := b.Store.(optimistic.Waiter)
	if !ok {
		return
	}
	syncKeys(t, b, key("k", 4))
	var last optimistic.Lease
	for range 4 {
		last = mustAllocate(t, b, shortTTL, "k")
	}
	line := lineUp(t, w, 4)
	waitPast(last.Until)
	var st optimistic.Stats
	err := line[0].Retry(context.Background(), time.Now().Add(time.Minute), func(ctx context.Context) (err error) {
		_, st, err = b.Store.Allocate(ctx, waitReq(0))
		return err
	})
	require.NoError(t, err)
	require.Equal(t, 4, st.Pruned)
	requireWoken(t, line[1:])
}

// lineUp puts n callers in line for k, in order; they leave when t ends.
func lineUp(t *testing.T, w optimistic.Waiter, n int) []*optimistic.Place {
	t.Helper()
	line := make([]*optimistic.Place, n)
	for i := range line {
		p, err := w.Await(context.Background(), []string{"k"})
		require.NoError(t, err)
		t.Cleanup(p.Leave)
		line[i] = p
	}
	return line
}

// requireWoken checks that each caller in line holds a wake-up already:
// the grant sent it before it returned, and nothing else ends a Wait
// before the hour is up, so each takes its wake-up at once or fails at
// the bound.
func requireWoken(t *testing.T, line []*optimistic.Place) {
	t.Helper()
	for i, p := range line {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := p.Wait(ctx, time.Now().Add(time.Hour))
		cancel()
		require.NoError(t, err, "caller %d in line was left for the poll", i)
	}
}
