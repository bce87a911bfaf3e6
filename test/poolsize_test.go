package test

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/optimistic"
)

// The Redis commands one allocate costs do not grow with the pool: the
// catalog is ranked in memory and only the best few candidates' live state
// is read (--inspect). Measured on a real redis-server with INFO's command
// count, at 32, 512 and 4,096 keys in the pool, with the live state read
// on every allocate (LiveMaxAge -1) and with it kept (0, the default
// --live-max-age). What keeping saves depends on how often the best
// candidates repeat, so it is logged, not asserted.
func TestAllocateCostIsBoundedByPoolSize(t *testing.T) {
	for _, liveMaxAge := range []time.Duration{-1, 0} {
		cost := allocateCost(t, liveMaxAge)
		require.LessOrEqual(t, cost[4096], 2*cost[32], "LiveMaxAge %v", liveMaxAge)
	}
}

// allocateCost is the Redis commands per allocate at 32, 512 and 4,096
// keys, with the broker's LiveMaxAge set to liveMaxAge (-1: read every
// time, as --live-max-age 0; 0: the default).
func allocateCost(t *testing.T, liveMaxAge time.Duration) map[int]float64 {
	const allocates = 10
	perAllocate := map[int]float64{}
	for _, n := range []int{32, 512, 4096} {
		s := startService(t, serviceOptions{liveMaxAge: liveMaxAge})
		keys := make([]catalog.Key, n)
		for i := range keys {
			keys[i] = catalog.Key{
				ID: fmt.Sprintf("k%04d", i), Provider: "openai", Pool: "default",
				Models: []string{"gpt-4o-2024-08-06"}, Secret: "sk-test",
				Status: optimistic.StatusAvailable, MaxConcurrentUses: 1000,
			}
		}
		_, err := s.cat.PutMany(t.Context(), keys...)
		require.NoError(t, err)
		_, err = s.adm.Sync(t.Context())
		require.NoError(t, err)

		before := commands(t, s)
		for range allocates {
			code, _, out := s.internal(t, "allocate-key", allocBody("default"))
			require.Equal(t, http.StatusOK, code, "%v", out)
		}
		perAllocate[n] = float64(commands(t, s)-before-1) / allocates // less the INFO itself
		how := "live state kept (the default)"
		if liveMaxAge < 0 {
			how = "live state read on every allocate (--live-max-age 0)"
		}
		t.Logf("%5d keys, %s: %.1f Redis commands per allocate", n, how, perAllocate[n])
	}
	return perAllocate
}

// commands is the number of commands the service's redis-server processed.
func commands(t *testing.T, s *service) int64 {
	t.Helper()
	info, err := s.redis.Client(t).Info(t.Context(), "stats").Result()
	require.NoError(t, err)
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("INFO stats has no total_commands_processed")
	return 0
}
