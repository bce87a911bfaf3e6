package test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// An allocate with wait_ms waits for the slot a release frees instead of
// answering 429, on both stores; a wait that runs out is a 429 as before.
func TestHTTPWaitForSlot(t *testing.T) {
	forEachStore(t, func(t *testing.T, sqlite bool) {
		s := startService(t, serviceOptions{sqlite: sqlite})
		s.putKey(t, "k1", "default", 1, nil)
		code, _, held := s.internal(t, "allocate-key", allocBody("default"))
		require.Equal(t, http.StatusOK, code)

		for _, bad := range []int{-1, 30001} {
			code, _, out := s.internal(t, "allocate-key", withField(allocBody("default"), "wait_ms", bad))
			require.Equal(t, http.StatusBadRequest, code, "wait_ms %d", bad)
			require.Equal(t, "invalid_request", errCode(out))
		}

		code, h, out := s.internal(t, "allocate-key", withField(allocBody("default"), "wait_ms", 50))
		require.Equal(t, http.StatusTooManyRequests, code, "%v", out)
		require.Equal(t, "pool_exhausted", errCode(out))
		require.NotEmpty(t, h.Get("Retry-After"))

		done := make(chan answer, 1)
		go func() {
			var a answer
			a.code, a.body, a.err = s.post("/api/internal/allocate-key", internalKey, withField(allocBody("default"), "wait_ms", 30000))
			done <- a
		}()
		require.Eventually(t, func() bool {
			n, ok := s.metric(t, "credpool_allocate_waiting")
			return ok && n == 1
		}, 10*time.Second, 5*time.Millisecond, "the request never waited in line")
		code, _, _ = s.internal(t, "release", leaseBody(held))
		require.Equal(t, http.StatusOK, code)
		a := <-done
		require.NoError(t, a.err)
		require.Equal(t, http.StatusOK, a.code, "%v", a.body)
		require.Equal(t, "k1", a.body["key_id"])

		waits, ok := s.metric(t, "credpool_allocate_wait_seconds_count")
		require.True(t, ok)
		require.EqualValues(t, 2, waits)
		n, _ := s.metric(t, "credpool_allocate_waiting")
		require.Zero(t, n)
	})
}

// A release of the service hands its slot to the request waiting for the
// key in the same instance (the store's handoff), and the broker confirms
// the handed lease against the catalog as it does a grant: a key disabled
// meanwhile is given back, and the request waits on.
func TestHTTPWaitingRequestHandedASlot(t *testing.T) {
	for _, disable := range []bool{false, true} {
		name := map[bool]string{false: "confirmed", true: "disabled in the catalog"}[disable]
		t.Run(name, func(t *testing.T) {
			var (
				s       *service
				rdb     redis.UniversalClient
				armed   atomic.Bool
				hookErr = make(chan error, 1)
				// watches is how many WATCHes the server had run when the
				// broker confirmed the grant the hook disabled.
				watches atomic.Int64
			)
			s = startService(t, serviceOptions{beforeGet: func(id string) {
				// Runs on the server's goroutine: it reports, not fails.
				if armed.CompareAndSwap(true, false) {
					watches.Store(watchCalls(rdb))
					hookErr <- s.disable(id)
				}
			}})
			rdb = s.redis.Client(t)
			s.putKey(t, "k1", "default", 1, nil)
			code, _, held := s.internal(t, "allocate-key", allocBody("default"))
			require.Equal(t, http.StatusOK, code)
			wait := func(ms int) <-chan answer {
				done := make(chan answer, 1)
				go func() {
					var a answer
					a.code, a.body, a.err = s.post("/api/internal/allocate-key", internalKey, withField(allocBody("default"), "wait_ms", ms))
					done <- a
				}()
				return done
			}
			waiting := func(n float64) func() bool {
				return func() bool { v, ok := s.metric(t, "credpool_allocate_waiting"); return ok && v == n }
			}
			first := wait(30000)
			require.Eventually(t, waiting(1), 10*time.Second, 5*time.Millisecond)
			second := wait(map[bool]int{false: 30000, true: 5000}[disable])
			require.Eventually(t, waiting(2), 10*time.Second, 5*time.Millisecond)
			// The first release frees the slot: the first request takes
			// it, and the instance learns that it alone waits for k1.
			code, _, _ = s.internal(t, "release", leaseBody(held))
			require.Equal(t, http.StatusOK, code)
			a := <-first
			require.NoError(t, a.err)
			require.Equal(t, http.StatusOK, a.code, "%v", a.body)
			require.Eventually(t, waiting(1), 10*time.Second, 5*time.Millisecond)

			armed.Store(disable)
			before := watchCalls(rdb)
			code, _, _ = s.internal(t, "release", leaseBody(a.body))
			require.Equal(t, http.StatusOK, code)
			b := <-second
			require.NoError(t, b.err)
			// Handed over: no grant of its own read the key under WATCH.
			after := watchCalls(rdb)
			_, key := s.admin(t, http.MethodGet, "keys/k1", nil)
			if !disable {
				require.Equal(t, before, after, "the slot was handed over")
				require.Equal(t, http.StatusOK, b.code, "%v", b.body)
				require.Equal(t, "k1", b.body["key_id"])
				require.Equal(t, "sk-secret-k1", b.body["credential"].(map[string]any)["api_key"])
				require.EqualValues(t, 1, key["live_leases"])
				return
			}
			require.NotEqual(t, http.StatusOK, b.code, "%v", b.body)
			require.NoError(t, <-hookErr)
			require.Equal(t, before, watches.Load(), "the slot was handed over")
			require.EqualValues(t, 0, key["live_leases"], "the handed slot was given back")
			require.Contains(t, s.logs.String(), `"reason":"status disabled"`)
		})
	}
}

// watchCalls is how many WATCH commands the server behind rdb has run.
func watchCalls(rdb redis.UniversalClient) int64 {
	stats := rdb.Info(context.Background(), "commandstats").Val()
	_, rest, _ := strings.Cut(stats, "cmdstat_watch:calls=")
	n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
	return n
}
