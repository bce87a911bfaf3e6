package handlers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/requestlog"
	"github.com/credpool/credpool/optimistic"
)

func TestStatusFor(t *testing.T) {
	storeDown := optimistic.Classify(context.Background(), "allocate", errors.New("connection refused"))
	for _, c := range []struct {
		err    error
		status int
		code   string
	}{
		{&optimistic.CapacityError{}, http.StatusTooManyRequests, "pool_exhausted"},
		{fmt.Errorf("%w: allocate", optimistic.ErrContended), http.StatusTooManyRequests, "contended"},
		{fmt.Errorf("%w: x", broker.ErrPolicy), http.StatusConflict, "policy_conflict"},
		{requestlog.ErrInFlight, http.StatusConflict, "request_in_flight"},
		{requestlog.ErrReused, http.StatusConflict, "request_id_reused"},
		{fmt.Errorf("%w: x", broker.ErrNoCandidates), http.StatusNotFound, "no_candidates"},
		{storeDown, http.StatusServiceUnavailable, "store_unavailable"},
		{fmt.Errorf("%w: %w", broker.ErrCatalog, storeDown), http.StatusServiceUnavailable, "catalog_unavailable"},
		{fmt.Errorf("%w: %w", broker.ErrCatalog, optimistic.ErrContended), http.StatusServiceUnavailable, "catalog_unavailable"},
		{optimistic.ErrLeaseMismatch, http.StatusConflict, "owner_mismatch"},
		{optimistic.ErrLeaseLost, http.StatusGone, "lease_lost"},
		{fmt.Errorf("%w: bad", optimistic.ErrInvalid), http.StatusBadRequest, "invalid_request"},
		{catalog.ErrNotFound, http.StatusNotFound, "key_not_found"},
		// A cancelled request is neither "full" nor "store down".
		{errors.Join(storeDown, context.Canceled), 499, "client_closed_request"},
		{errors.Join(errors.New("x"), context.DeadlineExceeded), http.StatusServiceUnavailable, "timeout"},
		{errors.New("boom"), http.StatusInternalServerError, "internal"},
		// A wait cut short by the shutdown is neither "full" nor "store down".
		{fmt.Errorf("waiting: %w", broker.ErrShuttingDown), http.StatusServiceUnavailable, "shutting_down"},
	} {
		status, code := statusFor(c.err)
		require.Equal(t, c.status, status, "%v", c.err)
		require.Equal(t, c.code, code, "%v", c.err)
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		err  error
		secs int
		ok   bool
	}{
		{&optimistic.CapacityError{FreeAt: now.Add(2500 * time.Millisecond)}, 3, true},
		{&optimistic.CapacityError{FreeAt: now.Add(35 * time.Second), Held: true}, 1, true},
		{&optimistic.CapacityError{FreeAt: now.Add(-time.Second)}, 1, true},
		{&optimistic.CapacityError{}, 0, false},
		{optimistic.ErrContended, 1, true},
	} {
		secs, ok := retryAfter(c.err, now)
		require.Equal(t, c.secs, secs, "%v", c.err)
		require.Equal(t, c.ok, ok, "%v", c.err)
	}
}

// An answer's message drops the package prefixes of every part of the
// error, and nothing else: a value that holds a colon stays whole.
func TestClientMessage(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&optimistic.CapacityError{}, "no free slot in candidates"},
		{fmt.Errorf("%w: no key of provider p in pools [default] serves model m:1", broker.ErrPolicy),
			"request conflicts with policy: no key of provider p in pools [default] serves model m:1"},
		{fmt.Errorf("broker: renew: %w", optimistic.ErrLeaseMismatch), "renew: lease lost: it belongs to another key, provider or pool"},
		{fmt.Errorf("%w: %q", catalog.ErrNotFound, "broker:"), `key not found: "broker:"`},
		{requestlog.ErrReused, "request id reused with other parameters"},
	} {
		require.Equal(t, c.want, clientMessage(c.err))
	}
}
