package optimistic

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/redisproc"
	rs "github.com/credpool/credpool/internal/redisschema"
	"github.com/credpool/credpool/test/redistest"
)

// narrowStore returns a store over a fresh server with key "k" of the
// given limit, another client of that server, and the request for "k".
func narrowStore(t *testing.T, limit int) (*Store, redis.UniversalClient, AllocateRequest) {
	t.Helper()
	srv := redistest.Start(t)
	s, err := New(srv.Client(t), nil)
	require.NoError(t, err)
	require.NoError(t, s.SyncKey(t.Context(), KeyState{ID: "k", Provider: "p", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: limit}))
	return s, srv.Client(t), AllocateRequest{Provider: "p", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute}
}

// A release between a grant's read and its EXEC only frees a slot: the
// grant commits, no conflict. A grant in between (it writes the key HASH)
// aborts it.
func TestReleaseDoesNotAbortGrant(t *testing.T) {
	s, other, req := narrowStore(t, 3)
	ctx := t.Context()
	held, _, err := s.Allocate(ctx, req)
	require.NoError(t, err)
	released := false
	s.rdb.AddHook(afterReadOf{key: s.keys.Key("k"), fn: func() {
		if !released {
			released = true
			require.NoError(t, other.ZRem(context.Background(), s.keys.Leases("k"), member(held.LeaseRef)).Err())
		}
	}})
	_, st, err := s.Allocate(ctx, req)
	require.NoError(t, err)
	require.Zero(t, st.Conflicts, "the release aborted the grant")

	granted := false
	s2, err := New(other, nil)
	require.NoError(t, err)
	s.rdb.AddHook(afterReadOf{key: s.keys.Key("k"), fn: func() {
		if !granted {
			granted = true
			_, _, err := s2.Allocate(context.Background(), req)
			require.NoError(t, err)
		}
	}})
	_, st, err = s.Allocate(ctx, req)
	require.NoError(t, err)
	require.Equal(t, 1, st.Conflicts, "another process's grant in between")
	infos, err := s.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, 3, infos[0].Live)
}

// A grant that would prune an expired lease watches the lease ZSET too: a
// renewal that revives that lease meanwhile (it read it live just before
// it expired) keeps its slot, whether it lands before the grant's second
// read or between that read and EXEC.
func TestRenewalOfPrunedLeaseAbortsGrant(t *testing.T) {
	for _, afterWide := range []bool{false, true} {
		s, other, req := narrowStore(t, 1)
		ctx := t.Context()
		m := rs.Member("old", "p", "default")
		past := time.Now().Add(-time.Second).UnixMilli()
		require.NoError(t, other.ZAdd(ctx, s.keys.Leases("k"), redis.Z{Score: float64(past), Member: m}).Err())
		// The wide read WATCHes the HASH first and the ZSET after it.
		renewed := false
		s.rdb.AddHook(watchHook{fn: func(args []any) {
			if renewed || (len(args) > 2) != afterWide {
				return
			}
			renewed = true
			until := time.Now().Add(time.Minute).UnixMilli()
			require.NoError(t, other.ZAddXX(context.Background(), s.keys.Leases("k"), redis.Z{Score: float64(until), Member: m}).Err())
		}})
		_, st, err := s.Allocate(ctx, req)
		require.ErrorIs(t, err, ErrNoCapacity, "afterWide=%v", afterWide)
		require.True(t, renewed)
		if afterWide {
			require.Equal(t, 1, st.Conflicts, "the renewal aborted the pruning grant")
		}
		score, err := other.ZScore(ctx, s.keys.Leases("k"), m).Result()
		require.NoError(t, err, "afterWide=%v: the renewed lease was pruned", afterWide)
		require.Greater(t, int64(score), time.Now().UnixMilli())
	}
}

// An expired lease is pruned by the next grant, after one more read that
// watches the lease ZSET: three round trips, no lone command.
func TestPruningGrantRoundTrips(t *testing.T) {
	s, other, req := narrowStore(t, 1)
	ctx := t.Context()
	m := rs.Member("old", "p", "default")
	require.NoError(t, other.ZAdd(ctx, s.keys.Leases("k"), redis.Z{Score: float64(time.Now().Add(-time.Second).UnixMilli()), Member: m}).Err())
	var rt redisproc.RoundTrips
	s.rdb.AddHook(&rt)
	_, st, err := s.Allocate(ctx, req)
	require.NoError(t, err)
	require.Equal(t, 1, st.Pruned)
	require.Equal(t, 1, st.Attempts)
	require.Equal(t, int64(3), rt.Pipelines.Load(), "the read, the read watching the ZSET too, MULTI..EXEC")
	require.Zero(t, rt.Commands.Load())
}

// watchHook is a go-redis hook that calls fn with the arguments of each
// WATCH sent in a pipeline, once the pipeline has run.
type watchHook struct{ fn func(args []any) }

func (watchHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (watchHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h watchHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if c.Name() == "watch" {
				h.fn(c.Args())
			}
		}
		return err
	}
}
