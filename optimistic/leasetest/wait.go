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
	ctx := context.Background()
	var last optimistic.Lease
	for range 4 {
		last = mustAllocate(t, b, shortTTL, "k")
	}
	var line []*optimistic.Place
	for range 4 {
		p, err := w.Await(ctx, []string{"k"})
		require.NoError(t, err)
		defer p.Leave()
		line = append(line, p)
	}
	waitPast(last.Until)
	_, st, err := b.Store.Allocate(ctx, waitReq(0))
	require.NoError(t, err)
	require.Equal(t, 4, st.Pruned)
	for i, p := range line[:3] {
		// The wake-up is in before Allocate returns: Wait takes it at
		// once, or runs out long before any poll.
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := p.Wait(wctx, time.Now().Add(time.Minute))
		cancel()
		require.NoError(t, err, "caller %d in line was left for the poll", i)
	}
}
