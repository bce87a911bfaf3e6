package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRetryable(t *testing.T) {
	for _, c := range []struct {
		err   error
		after time.Duration
		ok    bool
	}{
		{&Error{StatusCode: 429, Code: "pool_exhausted", RetryAfter: 3 * time.Second}, 3 * time.Second, true},
		{&Error{StatusCode: 429, Code: "pool_exhausted"}, 0, false},
		{&Error{StatusCode: 429, Code: "contended", RetryAfter: time.Second}, time.Second, true},
		{fmt.Errorf("wrapped: %w", &Error{StatusCode: 409, Code: "request_in_flight"}), 0, true},
		{&Error{StatusCode: 409, Code: "policy_conflict"}, 0, false},
		// Another instance behind the same address may serve it.
		{&Error{StatusCode: 503, Code: "shutting_down", RetryAfter: time.Second}, time.Second, true},
		// Each may hide a granted slot, which a retry with the same
		// request id returns.
		{&Error{StatusCode: 503, Code: "store_unavailable"}, 0, true},
		{&Error{StatusCode: 503, Code: "timeout"}, 0, true},
		{fmt.Errorf("%w: POST /api/internal/allocate-key: EOF", ErrUnreachable), 0, true},
		// A proxy's own gateway answer may hide one as well.
		{&Error{StatusCode: 502}, 0, true},
		{&Error{StatusCode: 503}, 0, true},
		{&Error{StatusCode: 504}, 0, true},
		{&Error{StatusCode: 500}, 0, false},
		{&Error{StatusCode: 503, Code: "catalog_unavailable"}, 0, false},
		{&Error{StatusCode: 400, Code: "invalid_request"}, 0, false},
		{context.Canceled, 0, false},
		{nil, 0, false},
	} {
		after, ok := retryable(c.err)
		require.Equal(t, c.ok, ok, "%v", c.err)
		require.Equal(t, c.after, after, "%v", c.err)
	}
}

// Retry stops at MaxAttempts, returns at once when the next pause would
// pass the deadline, and keeps both causes when ctx ends in a pause.
func TestRetryBounds(t *testing.T) {
	contended := &Error{StatusCode: 429, Code: "contended", RetryAfter: time.Millisecond}
	tries := 0
	r := &Retry{MaxAttempts: 3, MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
	err := r.do(context.Background(), func() error { tries++; return contended })
	require.ErrorIs(t, err, ErrContended)
	require.Equal(t, 3, tries)

	tries = 0
	full := &Error{StatusCode: 429, Code: "pool_exhausted", RetryAfter: time.Hour}
	err = (&Retry{}).do(context.Background(), func() error { tries++; return full })
	require.ErrorIs(t, err, ErrPoolExhausted)
	require.Equal(t, 1, tries, "a Retry-After past the deadline is not waited for")

	ctx, cancel := context.WithCancel(context.Background())
	err = (&Retry{MinBackoff: time.Hour, MaxElapsed: 2 * time.Hour}).do(ctx, func() error { cancel(); return contended })
	require.ErrorIs(t, err, ErrContended)
	require.ErrorIs(t, err, context.Canceled)

	var nilRetry *Retry
	tries = 0
	require.ErrorIs(t, nilRetry.do(context.Background(), func() error { tries++; return contended }), ErrContended)
	require.Equal(t, 1, tries)
}

func TestOutcomeOf(t *testing.T) {
	for _, c := range []struct {
		err     error
		outcome Outcome
		cool    time.Duration
	}{
		{nil, Success, 0},
		{errors.New("upstream timeout"), Failure, 0},
		{context.Canceled, "", 0},
		{fmt.Errorf("call: %w", &UpstreamError{StatusCode: 429, RetryAfter: time.Minute}), RateLimited, time.Minute},
		{&UpstreamError{StatusCode: 401}, AuthError, 0},
		{&UpstreamError{StatusCode: 403}, AuthError, 0},
		{&UpstreamError{StatusCode: 500}, Failure, 0},
	} {
		o, cool := OutcomeOf(c.err)
		require.Equal(t, c.outcome, o, "%v", c.err)
		require.Equal(t, c.cool, cool, "%v", c.err)
	}
}

func TestCheckResponse(t *testing.T) {
	now := time.Now()
	resp := func(status int, retryAfter string) *http.Response {
		h := http.Header{}
		if retryAfter != "" {
			h.Set("Retry-After", retryAfter)
		}
		return &http.Response{StatusCode: status, Header: h}
	}
	require.NoError(t, CheckResponse(resp(200, "")))
	require.NoError(t, CheckResponse(resp(304, "")))
	var up *UpstreamError
	require.ErrorAs(t, CheckResponse(resp(429, "30")), &up)
	require.Equal(t, 30*time.Second, up.RetryAfter)
	require.ErrorAs(t, CheckResponse(resp(429, now.Add(time.Hour).UTC().Format(http.TimeFormat))), &up)
	require.InDelta(t, time.Hour.Seconds(), up.RetryAfter.Seconds(), 2)
	require.ErrorAs(t, CheckResponse(resp(429, "soon")), &up)
	require.Zero(t, up.RetryAfter)
	// Past a day is a day, the service's longest cooldown; more seconds
	// than a Duration holds too.
	require.ErrorAs(t, CheckResponse(resp(429, now.AddDate(10, 0, 0).UTC().Format(http.TimeFormat))), &up)
	require.Equal(t, 24*time.Hour, up.RetryAfter)
	require.ErrorAs(t, CheckResponse(resp(429, "99999999999999999999")), &up)
	require.Equal(t, 24*time.Hour, up.RetryAfter)
	require.ErrorAs(t, CheckResponse(resp(403, "")), &up)
	require.Equal(t, 403, up.StatusCode)
}

// The wait before a renewal: the jittered interval, but never in the
// lease's last fifth (a RenewFraction near 1), and never a hot loop (a
// lease a skewed clock shortened, or one past its margin).
func TestRenewIn(t *testing.T) {
	const life = 3 * time.Second
	for _, c := range []struct {
		name        string
		d, left     time.Duration
		least, most time.Duration
	}{
		{"a third", life / 3, life, 800 * time.Millisecond, 1200 * time.Millisecond},
		{"a fraction near 1", life * 99 / 100, life, minRenewWait, life - life/5},
		{"a failed renewal late in the lease", life / 12, 100 * time.Millisecond, minRenewWait, minRenewWait},
		{"a lease of a few milliseconds", 10 * time.Millisecond, 30 * time.Millisecond, minRenewWait, minRenewWait},
	} {
		for range 200 {
			d := renewIn(c.d, c.left, life)
			require.GreaterOrEqual(t, d, c.least, c.name)
			require.LessOrEqual(t, d, c.most, c.name)
		}
	}
}

// roundTripFunc is a RoundTripper of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// An application that wrapped http.DefaultTransport gets a client that
// sends through its wrapper, not a panic.
func TestNewOverAWrappedDefaultTransport(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"lease_until":"2026-11-30T12:00:00Z"}`)
	}))
	defer srv.Close()
	orig := http.DefaultTransport
	t.Cleanup(func() { http.DefaultTransport = orig })
	var through atomic.Int32
	http.DefaultTransport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		through.Add(1)
		return orig.RoundTrip(r)
	})
	c, err := New(srv.URL, "internal-key", nil)
	require.NoError(t, err)
	_, err = c.Renew(t.Context(), LeaseRef{Provider: "openai", Pool: "default", KeyID: "k", LeaseID: "l"}, 0)
	require.NoError(t, err)
	require.EqualValues(t, 1, through.Load())
}

func TestLifetime(t *testing.T) {
	sent := time.Now()
	require.Equal(t, 35*time.Second, lifetime(0, sent.Add(35*time.Second), sent))
	require.Equal(t, 10*time.Second, lifetime(0, sent.Add(10*time.Second), sent), "a service with a shorter --max-lease")
	require.Equal(t, 2*time.Second, lifetime(1500*time.Millisecond, sent.Add(time.Hour), sent), "whole seconds, and never longer than asked")
	require.Equal(t, 5*time.Second, lifetime(5*time.Second, sent.Add(-time.Hour), sent), "a clock far off is ignored")
}

func TestErrorMessages(t *testing.T) {
	e := &Error{StatusCode: 429, Code: "pool_exhausted", Message: "every key is full"}
	require.Equal(t, "client: 429 pool_exhausted: every key is full", e.Error())
	require.Equal(t, "client: 502 Bad Gateway", (&Error{StatusCode: 502}).Error())
	require.Nil(t, (&Error{StatusCode: 500, Code: "internal"}).Unwrap())
}

// The client needs the standard library alone: a caller gets no service
// internals and no third-party module with it.
func TestStandardLibraryOnly(t *testing.T) {
	gobin, err := exec.LookPath("go")
	require.NoError(t, err)
	out, err := exec.Command(gobin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, []string{"github.com/credpool/credpool/client"}, strings.Fields(string(out)))
}

// The default HTTP client follows no redirect: the key header would go
// with it, to another host too.
func TestNoRedirectCarriesTheKey(t *testing.T) {
	plainTransport(t)
	var leaked atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Internal-Key") != "" {
			leaked.Add(1)
		}
	}))
	defer other.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer srv.Close()
	c, err := New(srv.URL, "internal-key-secret", nil)
	require.NoError(t, err)
	_, err = c.Allocate(t.Context(), AllocateRequest{Provider: "openai", Model: "m"})
	var e *Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, http.StatusTemporaryRedirect, e.StatusCode)
	require.Zero(t, leaked.Load(), "the key went to the redirect's host")
}

// A report answered 503 store_unavailable may have gone through (the
// store's reply lost after it applied it): a resend then answered "not
// found" is taken as that earlier report's success, not as a lost lease.
func TestFinishAfterAStoreFailureThatWentThrough(t *testing.T) {
	plainTransport(t)
	var reports atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if reports.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"error":{"code":"store_unavailable","message":"x"}}`)
			return
		}
		_, _ = io.WriteString(w, `{"released":false,"reason":"not_found_or_expired"}`)
	}))
	defer srv.Close()
	c, err := New(srv.URL, "internal-key-secret", nil)
	require.NoError(t, err)
	ref := LeaseRef{Provider: "openai", Pool: "default", KeyID: "k", LeaseID: "l"}
	require.NoError(t, c.finish(t.Context(), ref, Success, 0))
	require.Equal(t, int32(2), reports.Load())
}

// plainTransport makes http.DefaultTransport a plain one for t: the tests'
// own checks answers against the OpenAPI document, which a fake service's
// redirect or canned answer is not about.
func plainTransport(t *testing.T) {
	orig := http.DefaultTransport
	t.Cleanup(func() { http.DefaultTransport = orig })
	http.DefaultTransport = new(http.Transport)
}
