package optimistic

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/test/redistest"
)

// lineLen is how many tickets wait in keyID's line.
func (l *lines) lineLen(keyID string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m[keyID])
}

type allocated struct {
	lease Lease
	stats Stats
	err   error
}

// Calls waiting for a key's turn are granted by its holder in one commit:
// one read-decide round for all of them, each its own lease and fence, and
// calls whose provider or pool the key does not serve stay in line.
func TestWaitingCallsShareTheHoldersCommit(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	s, err := New(rdb, nil)
	require.NoError(t, err)
	ctx := t.Context()
	require.NoError(t, s.SyncKey(ctx, KeyState{ID: "k", Provider: "p", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 5}))

	release, err := s.enter(ctx, "k", true)
	require.NoError(t, err)
	const calls = 4
	out := make(chan allocated, calls+1)
	allocate := func(pool string) {
		go func() {
			l, st, err := s.Allocate(ctx, AllocateRequest{Provider: "p", Pool: pool, Candidates: []string{"k"}, TTL: time.Minute})
			out <- allocated{l, st, err}
		}()
	}
	for range calls {
		allocate("default")
		// One at a time, so the line's order is known.
		want := s.lines.lineLen("k") + 1
		require.Eventually(t, func() bool { return s.lines.lineLen("k") == want }, 5*time.Second, time.Millisecond)
	}
	allocate("vip")
	require.Eventually(t, func() bool { return s.lines.lineLen("k") == calls+1 }, 5*time.Second, time.Millisecond)
	release()

	var fences []int64
	attempts := 0
	for range calls {
		got := <-out
		require.NoError(t, got.err)
		require.Equal(t, "default", got.lease.Pool)
		fences = append(fences, got.lease.Fence)
		attempts += got.stats.Attempts
	}
	got := <-out
	require.ErrorIs(t, got.err, ErrNoCapacity, "a vip call is no member of the key's pool")
	require.Equal(t, 1, attempts, "one read-decide round granted all %d", calls)
	require.Len(t, slices.Compact(slices.Sorted(slices.Values(fences))), calls, "fences %v", fences)
	infos, err := s.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, calls, infos[0].Live)
	require.Zero(t, s.lines.lineLen("k"), "nothing stays in line")
}

// A call that gives up while in line leaves nothing behind: no ticket for
// a later holder to grant, no lease.
func TestCallLeavingTheLineTakesNoSlot(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	s, err := New(rdb, nil)
	require.NoError(t, err)
	require.NoError(t, s.SyncKey(t.Context(), KeyState{ID: "k", Provider: "p", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 5}))

	release, err := s.enter(t.Context(), "k", true)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, _, err := s.Allocate(ctx, AllocateRequest{Provider: "p", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute})
		done <- err
	}()
	require.Eventually(t, func() bool { return s.lines.lineLen("k") == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.Zero(t, s.lines.lineLen("k"))
	release()

	l, st, err := s.Allocate(t.Context(), AllocateRequest{Provider: "p", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, 1, st.Attempts)
	infos, err := s.Inspect(t.Context(), "k")
	require.NoError(t, err)
	require.Equal(t, 1, infos[0].Live, "only the last call's lease %s", l.LeaseID)
}
