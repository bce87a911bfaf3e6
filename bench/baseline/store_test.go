package baseline

import (
	"context"
	"strconv"
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
