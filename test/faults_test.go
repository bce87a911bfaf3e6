package test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/test/redistest"
)

// An EXEC that committed but whose reply was lost must not cost a second
// slot: the retry finds the lease id it already wrote and returns it.
func TestLostExecReplyReturnsCommittedLease(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	store, err := optimistic.New(rdb, nil)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, store.SyncKey(ctx, optimistic.KeyState{
		ID: "k", Provider: "openai", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: 2,
	}))

	proxy.CutNextExec()
	lease, st, err := store.Allocate(ctx, optimistic.AllocateRequest{
		Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute,
	})
	require.NoError(t, err)
	require.Equal(t, 1, proxy.Cuts(), "the EXEC reply was dropped")
	require.Equal(t, 2, st.Attempts, "one attempt, one recheck")
	infos, err := store.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, infos[0].Fence, lease.Fence, "the fence of the committed grant")
	require.Equal(t, 1, infos[0].Live, "the lost reply did not cost a second slot")
	require.NoError(t, store.Release(ctx, lease.LeaseRef), "the returned lease is the one in Redis")
	infos, err = store.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Zero(t, infos[0].Live)
}
