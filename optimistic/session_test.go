package optimistic

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/redisproc"
	"github.com/credpool/credpool/test/redistest"
)

// hookedNode returns the client that runs rdb's transactions (on a
// cluster, the master of every key: the test cluster has one) with rt
// counting its requests.
func hookedNode(t *testing.T, rdb redis.UniversalClient, rt *redisproc.RoundTrips) *redis.Client {
	t.Helper()
	node, ok := rdb.(*redis.Client)
	if c, isCluster := rdb.(*redis.ClusterClient); isCluster {
		var err error
		node, err = c.MasterForKey(t.Context(), "x")
		require.NoError(t, err)
		ok = true
	}
	require.True(t, ok, "%T", rdb)
	node.AddHook(rt)
	return node
}

// An allocation that passes over k full candidates and grants on the next
// one costs k+2 round trips: one read per full candidate, whose WATCH the
// next read releases (UNWATCH first in its own pipeline), then the grant's
// read and MULTI..EXEC. No lone UNWATCH at all; when every candidate is
// full, one at the end. The connection goes back to the pool unwatched.
func TestSkippedCandidatesCostOneRoundTrip(t *testing.T) {
	for _, onCluster := range []bool{false, true} {
		t.Run(fmt.Sprint("cluster=", onCluster), func(t *testing.T) {
			start := redistest.Start
			if onCluster {
				start = redistest.StartCluster
			}
			rdb := start(t).Client(t)
			s, err := New(rdb, nil)
			require.NoError(t, err)
			ctx := t.Context()
			const k = 4
			var full []string
			for i := range k {
				id := fmt.Sprint("full", i)
				full = append(full, id)
				require.NoError(t, s.SyncKey(ctx, KeyState{ID: id, Provider: "p", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 1}))
				_, _, err := s.Allocate(ctx, AllocateRequest{Provider: "p", Pool: "default", Candidates: []string{id}, TTL: time.Minute})
				require.NoError(t, err)
			}
			require.NoError(t, s.SyncKey(ctx, KeyState{ID: "free", Provider: "p", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 1}))

			var rt redisproc.RoundTrips
			node := hookedNode(t, rdb, &rt)
			l, st, err := s.Allocate(ctx, AllocateRequest{Provider: "p", Pool: "default", Candidates: append(full, "free"), TTL: time.Minute})
			require.NoError(t, err)
			require.Equal(t, "free", l.KeyID)
			require.Equal(t, k+1, st.Attempts)
			require.Equal(t, int64(k+2), rt.Pipelines.Load(), "k reads, the grant's read and MULTI..EXEC")
			require.Zero(t, rt.Commands.Load(), "no lone UNWATCH")
			requireUnwatched(t, node, s.keys.Key("full0"))

			rt.Reset()
			_, _, err = s.Allocate(ctx, AllocateRequest{Provider: "p", Pool: "default", Candidates: append(full, "free"), TTL: time.Minute})
			require.ErrorIs(t, err, ErrNoCapacity)
			require.Equal(t, int64(k+1), rt.Pipelines.Load(), "one read per candidate")
			require.Equal(t, int64(1), rt.Commands.Load(), "one UNWATCH at the end")
			requireUnwatched(t, node, s.keys.Key("free"))
		})
	}
}

// requireUnwatched checks that node's pool holds no connection that still
// watches key: a transaction on each pooled connection commits after key
// was written.
func requireUnwatched(t *testing.T, node *redis.Client, key string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, node.HSet(ctx, key, "touched", "1").Err())
	n := int(node.PoolStats().TotalConns)
	conns := make([]*redis.Conn, n)
	for i := range conns {
		conns[i] = node.Conn()
		res, err := conns[i].TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Ping(ctx)
			return nil
		})
		require.NoError(t, err, "pooled connection %d of %d still watched %s", i, n, key)
		require.Len(t, res, 1)
	}
	for _, c := range conns {
		require.NoError(t, c.Close())
	}
	require.NoError(t, node.HDel(ctx, key, "touched").Err())
}

// The UNWATCH that rides on the next candidate's read comes before its
// WATCH: a write on a skipped candidate while the call reads the next one
// does not abort the grant there.
func TestSkippedCandidateWriteAbortsNothing(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	other := srv.Client(t)
	s, err := New(rdb, nil)
	require.NoError(t, err)
	ctx := t.Context()
	require.NoError(t, s.SyncKey(ctx, KeyState{ID: "off", Provider: "p", Pool: "default", Status: StatusDisabled, MaxConcurrentUses: 1}))
	require.NoError(t, s.SyncKey(ctx, KeyState{ID: "on", Provider: "p", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 1}))
	rdb.AddHook(afterReadOf{key: s.keys.Key("on"), fn: func() {
		require.NoError(t, other.HSet(ctx, s.keys.Key("off"), "touched", "1").Err())
	}})
	l, st, err := s.Allocate(ctx, AllocateRequest{Provider: "p", Pool: "default", Candidates: []string{"off", "on"}, TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, "on", l.KeyID)
	require.Zero(t, st.Conflicts, "the skipped key's write aborted the grant")
}

// afterReadOf is a go-redis hook that calls fn after each pipeline that
// WATCHes key.
type afterReadOf struct {
	key string
	fn  func()
}

func (afterReadOf) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (afterReadOf) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h afterReadOf) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if args := c.Args(); c.Name() == "watch" && len(args) > 1 && args[1] == h.key {
				h.fn()
			}
		}
		return err
	}
}

// A key this process just skipped is read without WATCH while it stays
// full: one round trip per call, no UNWATCH. Once another process freed a
// slot, the peek is followed by a read under WATCH and the grant's
// MULTI..EXEC; the grant ends the note, so the next call on it reads
// under WATCH at once, and so does a call after this process's own
// release on a key it skipped; a sync or a clear-out ends the note too.
func TestFullKeyIsPeekedAt(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	s, err := New(rdb, nil)
	require.NoError(t, err)
	other, err := New(srv.Client(t), nil)
	require.NoError(t, err)
	ctx := t.Context()
	require.NoError(t, s.SyncKey(ctx, KeyState{ID: "k", Provider: "p", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 1}))
	req := AllocateRequest{Provider: "p", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute}
	held, _, err := s.Allocate(ctx, req)
	require.NoError(t, err)

	var rt redisproc.RoundTrips
	node := hookedNode(t, rdb, &rt)
	for i, want := range []int64{1, 0, 0} {
		rt.Reset()
		_, _, err := s.Allocate(ctx, req)
		require.ErrorIs(t, err, ErrNoCapacity)
		require.Equal(t, int64(1), rt.Pipelines.Load(), "call %d: one read", i)
		require.Equal(t, want, rt.Commands.Load(), "call %d: UNWATCH only after a read under WATCH", i)
	}
	requireUnwatched(t, node, s.keys.Key("k"))

	require.NoError(t, other.Release(ctx, held.LeaseRef))
	rt.Reset()
	held, st, err := s.Allocate(ctx, req)
	require.NoError(t, err)
	require.Equal(t, 1, st.Attempts)
	require.Equal(t, int64(3), rt.Pipelines.Load(), "the peek, the read under WATCH, MULTI..EXEC")
	require.Zero(t, rt.Commands.Load())

	require.NoError(t, s.Release(ctx, held.LeaseRef))
	rt.Reset()
	held, _, err = s.Allocate(ctx, req)
	require.NoError(t, err)
	require.Equal(t, int64(2), rt.Pipelines.Load(), "granted last time: read under WATCH at once")

	_, _, err = s.Allocate(ctx, req)
	require.ErrorIs(t, err, ErrNoCapacity)
	require.True(t, skipNoted(s, "k"))
	require.NoError(t, s.Release(ctx, held.LeaseRef))
	require.False(t, skipNoted(s, "k"), "the release ended the skip note")
	rt.Reset()
	_, _, err = s.Allocate(ctx, req)
	require.NoError(t, err)
	require.Equal(t, int64(2), rt.Pipelines.Load(), "released here since it was skipped: read under WATCH at once")

	s.notes.skipped("k")
	require.NoError(t, s.SyncKey(ctx, KeyState{ID: "k", Provider: "p", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 2}))
	require.False(t, skipNoted(s, "k"), "a sync ended the skip note")

	s.notes.skipped("k")
	n, err := s.ClearLeases(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.False(t, skipNoted(s, "k"), "a clear-out ended the skip note")
}
