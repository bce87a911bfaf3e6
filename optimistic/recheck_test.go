package optimistic

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/test/redistest"
)

// After an EXEC reply is lost on one candidate, no other candidate may
// grant before that one is rechecked, even while another call of this
// process holds its gate: one call, one slot.
func TestLostReplyIsRecheckedBeforeOtherCandidates(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	// A first pause long enough for the helper below to take a's turn
	// before the recheck does.
	s, err := New(rdb, &Options{MinBackoff: 50 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	require.NoError(t, err)
	ctx := t.Context()
	for _, id := range []string{"a", "b"} {
		require.NoError(t, s.SyncKey(ctx, KeyState{ID: id, Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 2}))
	}

	held := make(chan func(), 1)
	go func() {
		// Take a's turn the moment its EXEC reply is dropped, as a busy
		// neighbour call would. Give up with the test, or after a deadline
		// if the cut never comes.
		deadline := time.Now().Add(10 * time.Second)
		for proxy.Cuts() == 0 {
			if ctx.Err() != nil || time.Now().After(deadline) {
				held <- nil
				return
			}
			time.Sleep(50 * time.Microsecond)
		}
		release, err := s.enter(ctx, "a", true)
		if err != nil {
			release = nil
		}
		held <- release
	}()
	proxy.CutNextExec()
	done := make(chan error, 1)
	var lease Lease
	go func() {
		var err error
		lease, _, err = s.Allocate(ctx, AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"a", "b"}, TTL: time.Minute})
		done <- err
	}()
	release := <-held
	require.NotNil(t, release, "the proxy never cut an EXEC reply")
	// The helper holds a's turn while the call still needs it: the call
	// queues for it (a second reference) instead of granting on b.
	require.Eventually(t, func() bool { return s.gates.Users("a") == 2 }, 10*time.Second, time.Millisecond,
		"the call never waited for a's turn")
	select {
	case err := <-done:
		t.Fatalf("the call ended while the helper held a's turn: %v", err)
	default:
	}
	release()
	require.NoError(t, <-done)
	require.Equal(t, "a", lease.KeyID, "the committed lease on a is the answer")
	infos, err := s.Inspect(ctx, "a", "b")
	require.NoError(t, err)
	require.Equal(t, 1, infos[0].Live)
	require.Zero(t, infos[1].Live, "no second slot on b")
}

// A grant adopted after a lost EXEC reply counts only once acknowledged,
// like a fresh one: with no replica to acknowledge it, it is given back
// and the call fails.
func TestAdoptedGrantNeedsAcks(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	s, err := New(rdb, &Options{MinReplicas: 1, ReplicaTimeout: 20 * time.Millisecond})
	require.NoError(t, err)
	ctx := t.Context()
	require.NoError(t, s.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 2}))

	proxy.CutNextExec()
	l, st, err := s.Allocate(ctx, AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute})
	require.ErrorIs(t, err, ErrStore, "got %+v", l)
	require.ErrorIs(t, err, errUnreplicated)
	require.Equal(t, 1, proxy.Cuts(), "the EXEC reply was dropped")
	require.Equal(t, 2, st.Attempts, "one attempt, one recheck")
	infos, err := s.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Zero(t, infos[0].Live, "the adopted lease was given back")
	require.Empty(t, srv.Find(t, ":lease:"), "with its record")
}
