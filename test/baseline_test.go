package test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/bench/baseline"
	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/optimistic/leasetest"
	"github.com/credpool/credpool/test/redistest"
)

func newBaseline(t *testing.T, rdb redis.UniversalClient) optimistic.LeaseStore {
	s, err := baseline.New(rdb, nil)
	require.NoError(t, err)
	return s
}

func TestBaselineConformance(t *testing.T) {
	leasetest.Run(t, func(t *testing.T) leasetest.Backend { return redisBackend(t, standalone, newBaseline) })
}

func TestBaselineConformanceCluster(t *testing.T) {
	leasetest.Run(t, func(t *testing.T) leasetest.Backend { return redisBackend(t, cluster, newBaseline) })
}

func TestBaselineStress(t *testing.T) {
	leasetest.Stress(t, func(t *testing.T) leasetest.Backend { return redisBackend(t, standalone, newBaseline) }, 3*time.Second)
}

func newGatedBaseline(t *testing.T, rdb redis.UniversalClient) optimistic.LeaseStore {
	s, err := baseline.New(rdb, &baseline.Options{Gate: true})
	require.NoError(t, err)
	return s
}

// The benchmark's lua+gate keeps the contract: the turn changes the order
// candidates are tried in under concurrency, nothing else.
func TestGatedBaselineConformance(t *testing.T) {
	leasetest.Run(t, func(t *testing.T) leasetest.Backend { return redisBackend(t, standalone, newGatedBaseline) })
}

func TestGatedBaselineStress(t *testing.T) {
	leasetest.Stress(t, func(t *testing.T) leasetest.Backend { return redisBackend(t, standalone, newGatedBaseline) }, 3*time.Second)
}

// Both stores use one key schema, so either one sees, releases, renews and
// deletes what the other wrote.
func TestStoresShareSchema(t *testing.T) {
	for _, onCluster := range []bool{false, true} {
		start := redistest.Start
		if onCluster {
			start = redistest.StartCluster
		}
		rdb := start(t).Client(t)
		stores := map[string]optimistic.LeaseStore{
			"optimistic": newOptimistic(t, rdb),
			"baseline":   newBaseline(t, rdb),
		}
		for _, pair := range [][2]string{{"optimistic", "baseline"}, {"baseline", "optimistic"}} {
			name := pair[0] + " then " + pair[1]
			if onCluster {
				name += " on cluster"
			}
			t.Run(name, func(t *testing.T) {
				crossStore(t, stores[pair[0]], stores[pair[1]], "from-"+pair[0])
			})
		}
	}
}

// crossStore has writer sync and fill a key, and other take over from there.
func crossStore(t *testing.T, writer, other optimistic.LeaseStore, keyID string) {
	ctx := context.Background()
	req := optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{keyID}, TTL: time.Minute}
	require.NoError(t, writer.SyncKey(ctx, optimistic.KeyState{
		ID: keyID, Provider: req.Provider, Pool: req.Pool, Status: optimistic.StatusAvailable, MaxConcurrentUses: 2,
	}))
	first, _, err := writer.Allocate(ctx, req)
	require.NoError(t, err)
	second, _, err := writer.Allocate(ctx, req)
	require.NoError(t, err)

	_, _, err = other.Allocate(ctx, req)
	var ce *optimistic.CapacityError
	require.ErrorAs(t, err, &ce, "a key the other store filled is full")
	require.True(t, first.Until.Equal(ce.FreeAt), "FreeAt %v, first lease ends %v", ce.FreeAt, first.Until)
	infos, err := other.Inspect(ctx, keyID)
	require.NoError(t, err)
	require.Equal(t, 2, infos[0].Live)

	require.NoError(t, other.Release(ctx, first.LeaseRef))
	taken, _, err := other.Allocate(ctx, req)
	require.NoError(t, err)
	require.Greater(t, taken.Fence, second.Fence, "one fencing sequence per key")
	_, _, err = writer.Allocate(ctx, req)
	require.ErrorIs(t, err, optimistic.ErrNoCapacity, "and the other way round")
	until, err := writer.Renew(ctx, taken.LeaseRef, 2*time.Minute)
	require.NoError(t, err)
	require.True(t, until.After(taken.Until))

	require.NoError(t, other.DeleteKey(ctx, keyID))
	infos, err = writer.Inspect(ctx, keyID)
	require.NoError(t, err)
	require.False(t, infos[0].Exists)
	require.ErrorIs(t, writer.Release(ctx, taken.LeaseRef), optimistic.ErrLeaseLost)
}
