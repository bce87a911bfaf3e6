package test

import (
	"net/http"
	"testing"
	"time"

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
