package optimistic

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/test/redistest"
)

// Release reads EXEC's raw replies, which RESP2 and RESP3 spell apart
// (a score is a string or a double): both protocols tell a live lease
// from an expired one.
func TestReleaseOnBothProtocols(t *testing.T) {
	srv := redistest.Start(t)
	for _, proto := range []int{2, 3} {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Protocol: proto})
		t.Cleanup(func() { _ = rdb.Close() })
		s, err := New(rdb, &Options{Prefix: "p" + string(rune('0'+proto))})
		require.NoError(t, err)
		ctx := t.Context()
		require.NoError(t, s.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 2}))
		req := AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute}
		live, _, err := s.Allocate(ctx, req)
		require.NoError(t, err)
		require.NoError(t, s.Release(ctx, live.LeaseRef), "RESP%d", proto)

		req.TTL = time.Millisecond
		short, _, err := s.Allocate(ctx, req)
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond)
		err = s.Release(ctx, short.LeaseRef)
		require.ErrorIs(t, err, ErrLeaseLost)
		require.ErrorContains(t, err, short.LeaseID+" expired", "RESP%d: told from an unknown lease by its score", proto)
		require.ErrorIs(t, s.Release(ctx, live.LeaseRef), ErrLeaseLost, "RESP%d: released twice", proto)
	}
}

// A release whose reply is lost may have freed the slot: the caller
// waiting here is woken to find out, before Release returns, instead of
// being left for the poll (WaitPoll, or the lease's end a minute away).
// The caller in line is the test's own, so that nothing but a wake-up
// reaches it.
func TestReleaseOfUnknownOutcomeWakesTheNext(t *testing.T) {
	t.Run("client", func(t *testing.T) {
		releaseOfUnknownOutcome(t, func(addr string) redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: addr, DialerRetries: 1})
		})
	})
	t.Run("ring", func(t *testing.T) {
		releaseOfUnknownOutcome(t, func(addr string) redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, DialerRetries: 1})
		})
	})
}

func releaseOfUnknownOutcome(t *testing.T, open func(addr string) redis.UniversalClient) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	s := storeOn(t, open(proxy.Addr))
	ctx := t.Context()
	require.NoError(t, s.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 1}))
	held, _, err := s.Allocate(ctx, waitReq(0))
	require.NoError(t, err)
	p := s.queue.Join([]string{"k"})
	defer p.Leave()
	park(p)
	proxy.CutNextExec()
	require.Error(t, s.Release(ctx, held.LeaseRef))
	require.Equal(t, 1, proxy.Cuts())
	require.True(t, woken(p), "left for the poll")
	_, _, err = s.Allocate(ctx, waitReq(0))
	require.NoError(t, err, "the release had freed the slot")
}
