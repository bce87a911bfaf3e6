package test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/redisproc"
	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/test/redistest"
)

// An uncontended grant is two round trips (WATCH+reads, MULTI..EXEC) with
// no UNWATCH after EXEC; a skipped candidate costs its read, and a call
// that skipped them all one UNWATCH at the end (the next candidate's read
// carries the UNWATCH of the one before).
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
		require.Equal(t, int64(1), rt.Commands.Load(), "cluster=%v: one UNWATCH at the end", onCluster)
	}
}

// A release is one MULTI (TIME, ZSCORE, ZREM, DEL) and no lone command,
// on standalone and on Cluster (on the node that owns the key). A release
// that matches no lease, under a wrong provider, pool or key id, or of a
// lease already released, writes nothing at all and costs one more read
// (ZRANGE), which tells a mismatch from an unknown lease.
func TestReleaseRoundTrips(t *testing.T) {
	for _, onCluster := range []bool{false, true} {
		start := redistest.Start
		if onCluster {
			start = redistest.StartCluster
		}
		rdb := start(t).Client(t)
		store, err := optimistic.New(rdb, nil)
		require.NoError(t, err)
		ctx := t.Context()
		syncKey(t, store, "k", optimistic.StatusAvailable)
		syncKey(t, store, "other", optimistic.StatusAvailable)
		l, _, err := allocateK(ctx, store)
		require.NoError(t, err)
		_, _, err = allocateK(ctx, store)
		require.ErrorIs(t, err, optimistic.ErrNoCapacity, "limit 1")

		node := rdb
		if onCluster {
			node, err = rdb.(*redis.ClusterClient).MasterForKey(ctx, "x")
			require.NoError(t, err)
		}
		var rt redisproc.RoundTrips
		node.AddHook(&rt)

		before := snapshot(t, node.(*redis.Client))
		for _, c := range []struct {
			name     string
			ref      optimistic.LeaseRef
			mismatch bool
		}{
			{name: "provider", ref: optimistic.LeaseRef{Provider: "anthropic", Pool: l.Pool, KeyID: l.KeyID, LeaseID: l.LeaseID}, mismatch: true},
			{name: "pool", ref: optimistic.LeaseRef{Provider: l.Provider, Pool: "vip", KeyID: l.KeyID, LeaseID: l.LeaseID}, mismatch: true},
			{name: "key id", ref: optimistic.LeaseRef{Provider: l.Provider, Pool: l.Pool, KeyID: "other", LeaseID: l.LeaseID}},
			{name: "lease id", ref: optimistic.LeaseRef{Provider: l.Provider, Pool: l.Pool, KeyID: l.KeyID, LeaseID: "never-granted"}},
		} {
			rt.Reset()
			err := store.Release(ctx, c.ref)
			require.ErrorIs(t, err, optimistic.ErrLeaseLost, "cluster=%v, wrong %s", onCluster, c.name)
			if c.mismatch {
				require.ErrorIs(t, err, optimistic.ErrLeaseMismatch, "cluster=%v, wrong %s", onCluster, c.name)
			} else {
				require.NotErrorIs(t, err, optimistic.ErrLeaseMismatch, "cluster=%v, wrong %s", onCluster, c.name)
			}
			require.Equal(t, int64(1), rt.Pipelines.Load(), "cluster=%v, wrong %s: the MULTI", onCluster, c.name)
			require.Equal(t, int64(1), rt.Commands.Load(), "cluster=%v, wrong %s: the ZRANGE that says why", onCluster, c.name)
			require.Equal(t, before, snapshot(t, node.(*redis.Client)), "cluster=%v, wrong %s: nothing written", onCluster, c.name)
		}

		rt.Reset()
		require.NoError(t, store.Release(ctx, l.LeaseRef))
		require.Equal(t, int64(1), rt.Pipelines.Load(), "cluster=%v: one MULTI", onCluster)
		require.Zero(t, rt.Commands.Load(), "cluster=%v: no lone command", onCluster)
		infos, err := store.Inspect(ctx, "k")
		require.NoError(t, err)
		require.Zero(t, infos[0].Live, "cluster=%v: released", onCluster)

		rt.Reset()
		err = store.Release(ctx, l.LeaseRef)
		require.ErrorIs(t, err, optimistic.ErrLeaseLost, "cluster=%v: released twice", onCluster)
		require.NotErrorIs(t, err, optimistic.ErrLeaseMismatch)
		require.Equal(t, int64(2), rt.Total(), "cluster=%v: the MULTI and the ZRANGE", onCluster)
	}
}

// snapshot is every key on rdb's server with its serialized value and
// expiry: equal snapshots mean nothing was written in between.
func snapshot(t *testing.T, rdb *redis.Client) map[string]string {
	t.Helper()
	ctx := context.Background()
	names, err := rdb.Keys(ctx, "*").Result()
	require.NoError(t, err)
	out := make(map[string]string, len(names))
	for _, name := range names {
		dump, err := rdb.Dump(ctx, name).Result()
		require.NoError(t, err)
		at, err := rdb.PExpireTime(ctx, name).Result()
		require.NoError(t, err)
		out[name] = fmt.Sprintf("%q expires %d", dump, at)
	}
	return out
}

// Through go-redis's own WATCH (a Ring here, as a cluster slot that just
// moved), the commit goes through go-redis's TxPipelined, so go-redis
// knows EXEC dropped the watch: a grant is WATCH, the reads and the
// transaction, with no UNWATCH after it. With MinReplicas WAIT follows on
// the same connection, and a grant too few acknowledged is given back in
// one more round trip.
func TestAllocateRoundTripsThroughGoRedisWatch(t *testing.T) {
	for _, acks := range []int{0, 1} {
		srv := redistest.Start(t)
		var rt redisproc.RoundTrips
		ring := redis.NewRing(&redis.RingOptions{
			Addrs: map[string]string{"only": srv.Addr}, DialerRetries: 1,
			NewClient: func(opt *redis.Options) *redis.Client {
				c := redis.NewClient(opt)
				c.AddHook(&rt)
				return c
			},
		})
		t.Cleanup(func() { _ = ring.Close() })
		store, err := optimistic.New(ring, &optimistic.Options{MinReplicas: acks, ReplicaTimeout: 10 * time.Millisecond})
		require.NoError(t, err)
		syncKey(t, store, "k", optimistic.StatusAvailable)

		rt.Reset()
		_, _, err = allocateK(t.Context(), store)
		if acks == 0 {
			require.NoError(t, err)
			require.Equal(t, int64(2), rt.Pipelines.Load(), "the reads and the transaction")
			require.Equal(t, int64(1), rt.Commands.Load(), "WATCH, and no UNWATCH after EXEC")
			continue
		}
		require.ErrorIs(t, err, optimistic.ErrStore, "no replica acknowledged the grant")
		require.Equal(t, int64(3), rt.Pipelines.Load(), "the reads, the transaction and the give-back")
		require.Equal(t, int64(2), rt.Commands.Load(), "WATCH and WAIT")
		infos, err := store.Inspect(t.Context(), "k")
		require.NoError(t, err)
		require.Zero(t, infos[0].Live, "given back")
	}
}

// A grant too few replicas acknowledged is given back in one round trip:
// three in all, with no lone command.
func TestUnacknowledgedGrantRoundTrips(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	store, err := optimistic.New(rdb, &optimistic.Options{MinReplicas: 1, ReplicaTimeout: 10 * time.Millisecond})
	require.NoError(t, err)
	syncKey(t, store, "k", optimistic.StatusAvailable)
	var rt redisproc.RoundTrips
	rdb.AddHook(&rt)
	_, _, err = allocateK(t.Context(), store)
	require.ErrorIs(t, err, optimistic.ErrStore)
	require.Equal(t, int64(3), rt.Pipelines.Load(), "the reads, MULTI..EXEC+WAIT, the give-back")
	require.Zero(t, rt.Commands.Load())
	infos, err := store.Inspect(t.Context(), "k")
	require.NoError(t, err)
	require.Zero(t, infos[0].Live, "given back")
}

// After an EXEC reply is lost, the recheck's read takes the lease's fence
// along: no read of its own. Without MinReplicas the adopted grant then
// costs an UNWATCH; with it,
// the acknowledged rewrite's EXEC clears the watch, and an unacknowledged
// grant is given back in one MULTI.
func TestLostReplyRecoveryRoundTrips(t *testing.T) {
	const recheck = "watch time hmget zrange hmget"
	for _, c := range []struct {
		name    string
		acks    int
		replica bool
		want    []string // requests from the recheck on
	}{
		{name: "no acks", want: []string{recheck, "unwatch"}},
		{name: "acknowledged", acks: 1, replica: true, want: []string{recheck, "multi hset exec wait"}},
		{name: "unacknowledged", acks: 1, want: []string{recheck, "multi hset exec wait", "multi zrem del exec"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.Start(t)
			timeout := 10 * time.Millisecond
			if c.replica {
				redistest.StartReplica(t, srv.Addr)
				timeout = 5 * time.Second
			}
			proxy := redistest.NewProxy(t, srv.Addr)
			rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, DialerRetries: 1})
			t.Cleanup(func() { _ = rdb.Close() })
			store, err := optimistic.New(rdb, &optimistic.Options{MinReplicas: c.acks, ReplicaTimeout: timeout})
			require.NoError(t, err)
			syncKey(t, store, "k", optimistic.StatusAvailable)
			var log requestLog
			rdb.AddHook(&log)

			proxy.CutNextExec()
			l, st, err := allocateK(t.Context(), store)
			require.Equal(t, 1, proxy.Cuts(), "the EXEC reply was dropped")
			require.Equal(t, 2, st.Attempts, "one attempt, one recheck")
			require.Equal(t, c.want, log.since("watch", 2), "every request: %q", log.all())
			infos, ierr := store.Inspect(t.Context(), "k")
			require.NoError(t, ierr)
			if !c.replica && c.acks > 0 {
				require.ErrorIs(t, err, optimistic.ErrStore)
				require.Zero(t, infos[0].Live, "given back")
				return
			}
			require.NoError(t, err)
			require.Equal(t, 1, infos[0].Live, "one slot")
			require.Equal(t, infos[0].Fence, l.Fence, "the lease the lost EXEC wrote")
		})
	}
}

// requestLog is a go-redis hook that records each request (a lone command,
// or a pipeline's command names) but those of a connection's handshake.
type requestLog struct {
	mu   sync.Mutex
	reqs []string
}

func (r *requestLog) add(cmds ...redis.Cmder) {
	names := make([]string, len(cmds))
	for i, c := range cmds {
		names[i] = c.Name()
	}
	if names[0] == "hello" || names[0] == "client" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, strings.Join(names, " "))
}

func (r *requestLog) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.reqs)
}

// since returns the requests from the nth one that starts with name on.
func (r *requestLog) since(name string, nth int) []string {
	reqs := r.all()
	for i, req := range reqs {
		if strings.HasPrefix(req, name+" ") || req == name {
			if nth--; nth == 0 {
				return reqs[i:]
			}
		}
	}
	return nil
}

func (r *requestLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *requestLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.add(cmd)
		return next(ctx, cmd)
	}
}

func (r *requestLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.add(cmds...)
		return next(ctx, cmds)
	}
}

// syncKey syncs key id, limit 1, with the given status.
func syncKey(t *testing.T, store optimistic.LeaseStore, id string, status optimistic.Status) {
	t.Helper()
	require.NoError(t, store.SyncKey(t.Context(), optimistic.KeyState{ID: id, Provider: "openai", Pool: "default", Status: status, MaxConcurrentUses: 1}))
}

// allocateK asks store for a lease on key "k".
func allocateK(ctx context.Context, store optimistic.LeaseStore) (optimistic.Lease, optimistic.Stats, error) {
	return store.Allocate(ctx, optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute})
}

// skipping returns a store over srv on a client of one pooled connection
// (opts; Addr defaults to srv's) whose key "k" is disabled, so that every
// Allocate reads it under WATCH and skips it; and another client of srv,
// to write behind the store's back.
func skipping(t *testing.T, srv *redistest.Server, opts redis.Options) (*optimistic.Store, *redis.Client, redis.UniversalClient) {
	t.Helper()
	if opts.Addr == "" {
		opts.Addr = srv.Addr
	}
	opts.PoolSize = 1
	rdb := redis.NewClient(&opts)
	t.Cleanup(func() { _ = rdb.Close() })
	store, err := optimistic.New(rdb, nil)
	require.NoError(t, err)
	syncKey(t, store, "k", optimistic.StatusDisabled)
	return store, rdb, srv.Client(t)
}

// touchK writes key "k" through other, as someone else would: a
// connection still watching it would abort its next EXEC.
func touchK(t *testing.T, other redis.UniversalClient) {
	t.Helper()
	require.NoError(t, other.HSet(t.Context(), "credpool:key:{k}", "status", "pending").Err())
}

// A skipped candidate must not leave its WATCH on the pooled connection:
// the next transaction on that connection would abort for nothing.
func TestSkippedCandidateLeavesNoWatch(t *testing.T) {
	store, rdb, other := skipping(t, redistest.Start(t), redis.Options{})
	_, _, err := allocateK(t.Context(), store)
	require.ErrorIs(t, err, optimistic.ErrNoCapacity)
	touchK(t, other)
	require.NoError(t, probeCommits(t, rdb), "the connection came back watching")
	require.Equal(t, "1", other.Get(t.Context(), "probe").Val())
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
// someone has written since. (Plain pipelines may use connections of
// their own, so the probe is a WATCH transaction, like the store's.)
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
	store, rdb, other := skipping(t, redistest.Start(t), redis.Options{ContextTimeoutEnabled: true})
	conn, err := rdb.ClientID(t.Context()).Result()
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	rdb.AddHook(expireAfterWatch{})
	_, _, err = allocateK(ctx, store)
	require.ErrorIs(t, err, optimistic.ErrNoCapacity)
	require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded, "the deadline passed before the UNWATCH")

	touchK(t, other)
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
	_, rdb, other := skipping(t, srv, redis.Options{Addr: proxy.Addr, MaxRetries: -1})
	ctx := t.Context()
	for range 20 {
		// A fresh store each time: a store that just skipped "k" reads it
		// without WATCH for a while, and so sends no UNWATCH to refuse.
		store, err := optimistic.New(rdb, nil)
		require.NoError(t, err)
		proxy.RefuseNext("unwatch")
		_, _, err = allocateK(ctx, store)
		require.ErrorIs(t, err, optimistic.ErrNoCapacity)
		if err := rdb.Get(ctx, "unrelated").Err(); !errors.Is(err, redis.Nil) {
			require.NoError(t, err, "the next caller got the dead connection")
		}
	}
	require.Equal(t, 20, proxy.Refusals())
	touchK(t, other)
	require.NoError(t, probeCommits(t, rdb), "a still-watching connection served again")
}
