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
	s, err := New(rdb, nil)
	require.NoError(t, err)
	ctx := t.Context()
	for _, id := range []string{"a", "b"} {
		require.NoError(t, s.SyncKey(ctx, KeyState{ID: id, Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 2}))
	}

	held := make(chan func(), 1)
	go func() {
		// Take a's turn the moment its EXEC reply is dropped, and keep it
		// for a while, as a busy neighbour call would. Give up with the
		// test, or after a deadline if the cut never comes.
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
	time.Sleep(100 * time.Millisecond)
	release()
	require.NoError(t, <-done)
	require.Equal(t, "a", lease.KeyID, "the committed lease on a is the answer")
	infos, err := s.Inspect(ctx, "a", "b")
	require.NoError(t, err)
	require.Equal(t, 1, infos[0].Live)
	require.Zero(t, infos[1].Live, "no second slot on b")
}
