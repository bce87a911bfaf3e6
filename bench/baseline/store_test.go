package baseline

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/test/redistest"
)

func newTestStore(t *testing.T) (*Store, redis.UniversalClient) {
	t.Helper()
	rdb := redistest.Start(t).Client(t)
	s, err := New(rdb, nil)
	require.NoError(t, err)
	return s, rdb
}

// The scripts must read stored fields exactly as the optimistic store does,
// or the two would disagree about the same key.
func TestLuaParsesLikeGo(t *testing.T) {
	_, rdb := newTestStore(t)
	ctx := context.Background()
	limit := redis.NewScript(libLua + "return parse_limit(ARGV[1])")
	for _, raw := range []string{"", "abc", "0", "-3", "2.5", "1", "7", " 3", "3 ", "+3", "007", "1e3", "0x10", "9223372036854775808"} {
		got, err := limit.Run(ctx, rdb, nil, raw).Int()
		require.NoError(t, err)
		require.Equal(t, optimistic.ParseLimit(raw), got, "max_concurrent_uses %q", raw)
	}
	const now = 1_000
	usable := redis.NewScript(libLua + "return usable(ARGV[1], ARGV[2], tonumber(ARGV[3])) and 1 or 0")
	for _, status := range []optimistic.Status{
		optimistic.StatusAvailable, optimistic.StatusPending, optimistic.StatusDisabled,
		optimistic.StatusExhausted, optimistic.StatusRateLimited, optimistic.StatusCooldown, "", "AVAILABLE",
	} {
		for _, cd := range []string{"", "soon", "999", "1000", "1001", "+999", "999.0", " 999", "-5"} {
			got, err := usable.Run(ctx, rdb, nil, string(status), cd, now).Bool()
			require.NoError(t, err)
			require.Equal(t, optimistic.Usable(status, cd, now), got, "%q cooldown %q", status, cd)
		}
	}
}

// A key held back after a loss (held_until, which the optimistic store
// writes when it finds Redis behind) grants nothing through the script
// either, and both stores tell the same moment it may free up: the hold's
// end when it is later than a lease's or a cooldown's, else theirs.
func TestLuaHonoursAHold(t *testing.T) {
	s, rdb := newTestStore(t)
	ctx := context.Background()
	opt, err := optimistic.New(rdb, nil)
	require.NoError(t, err)
	now := time.Now()
	ms := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).UnixMilli(), 10) }
	req := optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute}
	for _, c := range []struct {
		name       string
		status     optimistic.Status
		cooldown   string
		hold       time.Duration
		full       bool
		want       time.Duration
		byTheLease bool
	}{
		{"room, held", optimistic.StatusAvailable, "", time.Hour, false, time.Hour, false},
		{"full, held past the lease", optimistic.StatusAvailable, "", time.Hour, true, time.Hour, false},
		{"full, held less than the lease", optimistic.StatusAvailable, "", 30 * time.Second, true, time.Minute, true},
		{"cooling, held past the cooldown", optimistic.StatusRateLimited, ms(time.Minute), time.Hour, false, time.Hour, false},
		{"cooling, held less than the cooldown", optimistic.StatusRateLimited, ms(time.Hour), time.Minute, false, time.Hour, false},
	} {
		require.NoError(t, rdb.FlushAll(ctx).Err())
		require.NoError(t, s.SyncKey(ctx, optimistic.KeyState{ID: "k", Provider: "openai", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: 1}))
		if c.full {
			_, _, err := s.Allocate(ctx, req)
			require.NoError(t, err, c.name)
		}
		key := "credpool:key:{k}"
		require.NoError(t, rdb.HSet(ctx, key, "status", string(c.status), "cooldown_until", c.cooldown, "held_until", ms(c.hold)).Err())
		for name, store := range map[string]optimistic.LeaseStore{"lua": s, "optimistic": opt} {
			_, _, err := store.Allocate(ctx, req)
			var ce *optimistic.CapacityError
			require.ErrorAs(t, err, &ce, "%s: %s", c.name, name)
			require.WithinDuration(t, now.Add(c.want), ce.FreeAt, 5*time.Second, "%s: %s", c.name, name)
			require.Equal(t, c.byTheLease, ce.Held, "%s: %s", c.name, name)
		}
	}
}

// go-redis resends a script whose reply was lost: the rerun must return the
// lease the first run granted, not take a second slot.
func TestResentAllocateReturnsSameLease(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	require.NoError(t, s.SyncKey(ctx, optimistic.KeyState{
		ID: "k", Provider: "openai", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: 2,
	}))
	req := optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute}
	const leaseID = "0f8fad5b-d9cb-469f-a165-70867728950e"
	first, err := s.claim(ctx, req, "k", leaseID)
	require.NoError(t, err)
	again, err := s.claim(ctx, req, "k", leaseID)
	require.NoError(t, err)
	require.Equal(t, []int64{1, first[1], first[2], 0}, again, "same lease, same fence, nothing pruned")
	infos, err := s.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, 1, infos[0].Live)
	require.Equal(t, first[2], infos[0].Fence)
}

// The script hands out optimistic.NextFence exactly, though Lua numbers
// are doubles and Redis writes large ones in exponent notation.
func TestLuaFenceIsExact(t *testing.T) {
	s, rdb := newTestStore(t)
	ctx := context.Background()
	require.NoError(t, s.SyncKey(ctx, optimistic.KeyState{
		ID: "k", Provider: "openai", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: 5,
	}))
	req := optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute}
	var last int64
	for range 5 {
		before := time.Now().UnixMicro()
		l, _, err := s.Allocate(ctx, req)
		require.NoError(t, err)
		require.Greater(t, l.Fence, last)
		require.GreaterOrEqual(t, l.Fence, before, "never below the clock part")
		stored, err := rdb.HGet(ctx, "credpool:key:{k}", "fence").Result()
		require.NoError(t, err)
		require.Equal(t, strconv.FormatInt(l.Fence, 10), stored, "stored as an exact integer")
		last = l.Fence
	}
}

func TestNewRejectsBadPrefix(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	_, err := New(rdb, &Options{Prefix: "a{b"})
	require.ErrorIs(t, err, optimistic.ErrInvalid)
	_, err = New(nil, nil)
	require.Error(t, err)
}

func newGatedStore(t *testing.T) *Store {
	t.Helper()
	s, err := New(redistest.Start(t).Client(t), &Options{Gate: true})
	require.NoError(t, err)
	return s
}

// With the gate, a candidate another call of this store works on is tried
// after the others, and waited for only when none of them grants.
func TestGatedAllocateTriesBusyKeyLast(t *testing.T) {
	s := newGatedStore(t)
	ctx := t.Context()
	for _, id := range []string{"a", "b"} {
		require.NoError(t, s.SyncKey(ctx, optimistic.KeyState{
			ID: id, Provider: "openai", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: 1,
		}))
	}
	req := optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"a", "b"}, TTL: time.Minute}
	release, err := s.gates.Enter(ctx, "a")
	require.NoError(t, err)
	l, st, err := s.Allocate(ctx, req)
	require.NoError(t, err)
	require.Equal(t, "b", l.KeyID, "a is busy in this process, b has room")
	require.Equal(t, 1, st.Attempts, "a was not run while busy")

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, st, err = s.Allocate(short, req)
	require.ErrorIs(t, err, context.DeadlineExceeded, "b is full, a's turn never comes")
	require.Equal(t, 1, st.Attempts)
	require.Equal(t, 1, s.gates.Users("a"), "the wait left with its ctx")

	release()
	l, _, err = s.Allocate(ctx, req)
	require.NoError(t, err)
	require.Equal(t, "a", l.KeyID)
	require.Zero(t, s.gates.Len(), "no gate outlives its use")
}

// A busy candidate met again is waited for only once every candidate left
// is busy: one that came free meanwhile is taken, as the optimistic store
// does, not left behind the first busy one.
func TestGatedAllocateWaitsOnlyWhenAllLeftAreBusy(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t).(*redis.Client)
	s, err := New(rdb, &Options{Gate: true})
	require.NoError(t, err)
	ctx := t.Context()
	for _, id := range []string{"a", "b", "c"} {
		require.NoError(t, s.SyncKey(ctx, optimistic.KeyState{
			ID: id, Provider: "openai", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: 1,
		}))
	}
	_, _, err = s.Allocate(ctx, optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"c"}, TTL: time.Minute})
	require.NoError(t, err)
	releaseA, err := s.gates.Enter(ctx, "a")
	require.NoError(t, err)
	defer releaseA()
	releaseB, err := s.gates.Enter(ctx, "b")
	require.NoError(t, err)
	// b comes free while c, full, is read.
	rdb.AddHook(onScript{run: sync.OnceFunc(releaseB)})
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l, st, err := s.Allocate(short, optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"a", "b", "c"}, TTL: time.Minute})
	require.NoError(t, err, "not stuck behind a")
	require.Equal(t, "b", l.KeyID)
	require.Equal(t, 2, st.Attempts, "c, then b")
}

// onScript runs run when a script runs, before it is sent.
type onScript struct{ run func() }

func (onScript) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h onScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" || cmd.Name() == "eval" {
			h.run()
		}
		return next(ctx, cmd)
	}
}
func (onScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Many callers of one gated store on one hot key: never more holders than
// the limit, every call either granted or told no slot, and no gate left.
func TestGatedNeverOversells(t *testing.T) {
	s := newGatedStore(t)
	ctx := t.Context()
	const limit = 2
	require.NoError(t, s.SyncKey(ctx, optimistic.KeyState{
		ID: "hot", Provider: "openai", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: limit,
	}))
	req := optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"hot"}, TTL: time.Minute}
	var (
		holders, most, grants atomic.Int64
		wg                    sync.WaitGroup
	)
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			for range 20 {
				l, _, err := s.Allocate(ctx, req)
				if errors.Is(err, optimistic.ErrNoCapacity) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				grants.Add(1)
				n := holders.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(200 * time.Microsecond)
				holders.Add(-1)
				if err := s.Release(ctx, l.LeaseRef); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Positive(t, grants.Load())
	require.LessOrEqual(t, most.Load(), int64(limit))
	infos, err := s.Inspect(ctx, "hot")
	require.NoError(t, err)
	require.Zero(t, infos[0].Live, "every grant was released")
	require.Zero(t, s.gates.Len())
}
