package test

import (
	"context"
	"errors"
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
	for _, onCluster := range []bool{false, true} {
		start := redistest.Start
		if onCluster {
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
		if onCluster {
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
		require.Equal(t, int64(2), rt.Pipelines.Load(), "cluster=%v: pipelines for one uncontended grant", onCluster)
		require.Zero(t, rt.Commands.Load(), "cluster=%v: no lone command (no UNWATCH after EXEC)", onCluster)

		rt.Reset()
		req.Candidates = []string{"full", "free"}
		_, _, err = store.Allocate(ctx, req)
		require.ErrorIs(t, err, optimistic.ErrNoCapacity)
		require.Equal(t, int64(2), rt.Pipelines.Load(), "cluster=%v: one read per candidate", onCluster)
		require.Equal(t, int64(2), rt.Commands.Load(), "cluster=%v: one UNWATCH per skipped candidate", onCluster)
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

// expireAfterWatch is a go-redis hook that, after the first pipeline that
// sends WATCH, waits for the caller's ctx to end: its deadline passes
// between a skipped candidate's read and its UNWATCH.
type expireAfterWatch struct{}

func (expireAfterWatch) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (expireAfterWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (expireAfterWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if len(cmds) > 0 && cmds[0].Name() == "watch" {
			<-ctx.Done()
		}
		return err
	}
}

// probeCommits runs a WATCH transaction on rdb's connection and says
// whether it committed: it does not if that connection still watched a key
// someone has written since.
func probeCommits(t *testing.T, rdb *redis.Client) error {
	t.Helper()
	ctx := context.Background()
	return rdb.Watch(ctx, func(tx *redis.Tx) error {
		_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, "probe", "1", 0)
			return nil
		})
		return err
	}, "probe")
}

// A caller whose deadline passes between a skipped candidate's read and
// its UNWATCH still releases the watch cleanly. With ContextTimeoutEnabled
// (as serve sets it), an UNWATCH sent on the expired ctx would time out
// and cost the pool its connection.
func TestDeadlineDuringSkipKeepsConnection(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	other := srv.Client(t)
	store, err := optimistic.New(rdb, nil)
	require.NoError(t, err)
	require.NoError(t, store.SyncKey(t.Context(), optimistic.KeyState{ID: "k", Provider: "openai", Pool: "default", Status: optimistic.StatusDisabled}))
	conn, err := rdb.ClientID(t.Context()).Result()
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	rdb.AddHook(expireAfterWatch{})
	_, _, err = store.Allocate(ctx, optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute})
	require.ErrorIs(t, err, optimistic.ErrNoCapacity)
	require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded, "the deadline passed before the UNWATCH")

	require.NoError(t, other.HSet(t.Context(), "credpool:key:{k}", "status", "pending").Err())
	require.NoError(t, probeCommits(t, rdb), "the connection came back watching")
	again, err := rdb.ClientID(t.Context()).Result()
	require.NoError(t, err)
	require.Equal(t, conn, again, "the pooled connection was dropped")
}

// A server that refuses UNWATCH leaves the connection watching: the store
// has the server close it and the pool drop it before it serves another
// caller, who neither sees the watch nor a dead connection.
func TestRefusedUnwatchRetiresConnection(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	// No retries: a dead connection handed out would surface as an error.
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, PoolSize: 1, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	other := srv.Client(t)
	store, err := optimistic.New(rdb, nil)
	require.NoError(t, err)
	ctx := t.Context()
	require.NoError(t, store.SyncKey(ctx, optimistic.KeyState{ID: "k", Provider: "openai", Pool: "default", Status: optimistic.StatusDisabled}))

	for range 20 {
		proxy.RefuseNext("unwatch")
		_, _, err = store.Allocate(ctx, optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute})
		require.ErrorIs(t, err, optimistic.ErrNoCapacity)
		if err := rdb.Get(ctx, "unrelated").Err(); !errors.Is(err, redis.Nil) {
			require.NoError(t, err, "the next caller got the dead connection")
		}
	}
	require.Equal(t, 20, proxy.Refusals())
	require.NoError(t, other.HSet(ctx, "credpool:key:{k}", "status", "pending").Err())
	require.NoError(t, probeCommits(t, rdb), "a still-watching connection served again")
}
