package test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/redisproc"
	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/test/redistest"
)

// An uncontended grant is two round trips (WATCH+reads, MULTI..EXEC) with
// no UNWATCH after EXEC; a skipped candidate costs its read and an UNWATCH.
func TestAllocateRoundTrips(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		start := redistest.Start
		if cluster {
			start = redistest.StartCluster
		}
		srv := start(t)
		rdb := srv.Client(t)
		store, err := optimistic.New(rdb, nil)
		require.NoError(t, err)
		ctx := context.Background()
		for _, id := range []string{"full", "free"} {
			require.NoError(t, store.SyncKey(ctx, optimistic.KeyState{ID: id, Provider: "openai", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: 1}))
		}
		req := optimistic.AllocateRequest{Provider: "openai", Pool: "default", TTL: time.Minute}
		req.Candidates = []string{"full"}
		_, _, err = store.Allocate(ctx, req)
		require.NoError(t, err)

		var rt redisproc.RoundTrips
		if cluster {
			// Transactions run on the node's own client.
			node, err := rdb.(*redis.ClusterClient).MasterForKey(ctx, "x")
			require.NoError(t, err)
			node.AddHook(&rt)
		} else {
			rdb.AddHook(&rt)
		}
		req.Candidates = []string{"free"}
		_, _, err = store.Allocate(ctx, req)
		require.NoError(t, err)
		require.Equal(t, int64(2), rt.Pipelines.Load(), "cluster=%v: pipelines for one uncontended grant", cluster)
		require.Zero(t, rt.Commands.Load(), "cluster=%v: no lone command (no UNWATCH after EXEC)", cluster)

		rt.Reset()
		req.Candidates = []string{"full", "free"}
		_, _, err = store.Allocate(ctx, req)
		require.ErrorIs(t, err, optimistic.ErrNoCapacity)
		require.Equal(t, int64(2), rt.Pipelines.Load(), "cluster=%v: one read per candidate", cluster)
		require.Equal(t, int64(2), rt.Commands.Load(), "cluster=%v: one UNWATCH per skipped candidate", cluster)
	}
}

// A skipped candidate must not leave its WATCH on the pooled connection:
// the next transaction on that connection would abort for nothing.
func TestSkippedCandidateLeavesNoWatch(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	other := srv.Client(t)
	store, err := optimistic.New(rdb, nil)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, store.SyncKey(ctx, optimistic.KeyState{ID: "k", Provider: "openai", Pool: "default", Status: optimistic.StatusDisabled}))

	_, _, err = store.Allocate(ctx, optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute})
	require.ErrorIs(t, err, optimistic.ErrNoCapacity)
	// Someone writes the key the skipped attempt watched ...
	require.NoError(t, other.HSet(ctx, "credpool:key:{k}", "status", "pending").Err())
	// ... and the next transaction on the one pooled connection still
	// commits. (Plain pipelines may use connections of their own, so the
	// probe is a WATCH transaction, like the store's.)
	err = rdb.Watch(ctx, func(tx *redis.Tx) error {
		_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, "probe", "1", 0)
			return nil
		})
		return err
	}, "probe")
	require.NoError(t, err)
	require.Equal(t, "1", other.Get(ctx, "probe").Val())
}
