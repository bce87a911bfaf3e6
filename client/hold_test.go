package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/client"
	"github.com/credpool/credpool/test/openapitest"
)

// The test leases are short so that a renewal interval is about a second.
const (
	testLease = 3 * time.Second
	// maxRenewEvery is the longest pause between renewals of a testLease:
	// a third of it, jittered by up to 20%.
	maxRenewEvery = testLease * 12 / 30
	// roundTrip bounds one request to a local service on a busy machine.
	roundTrip = 2 * time.Second
)

// clients returns a Client and an Admin of s whose every exchange is
// checked against the OpenAPI document, unless opts has an HTTPClient.
func clients(t *testing.T, s *service, opts *client.Options) (*client.Client, *client.Admin) {
	t.Helper()
	var o client.Options
	if opts != nil {
		o = *opts
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Transport: openapitest.Transport(plain)}
	}
	c, err := client.New(s.url, internalKey, &o)
	require.NoError(t, err)
	adm, err := client.NewAdmin(s.url, adminKey, &o)
	require.NoError(t, err)
	return c, adm
}

func putKey(t *testing.T, adm *client.Admin, id string, limit int) client.KeySpec {
	t.Helper()
	spec := client.KeySpec{
		Provider: "openai", Pool: "default", Models: []string{"gpt-4o-2024-08-06"},
		Secret: client.Secret("sk-test-" + id), MaxConcurrentUses: limit,
	}
	_, err := adm.PutKey(t.Context(), id, spec)
	require.NoError(t, err)
	return spec
}

func request() client.AllocateRequest {
	return client.AllocateRequest{Provider: "openai", Model: "gpt-4o-2024-08-06", Lease: testLease}
}

// liveLeases reads the key's live leases through the admin API.
func liveLeases(t *testing.T, adm *client.Admin, id string) int {
	t.Helper()
	k, err := adm.Key(t.Context(), id)
	require.NoError(t, err)
	return k.LiveLeases
}

// A key disabled through the admin API while a Hold works with it: the
// work's ctx is cancelled by the next renewal, within one renewal
// interval, with a cause that says the lease was lost.
func TestHoldCancelsWhenKeyIsDisabled(t *testing.T) {
	s := start(t)
	c, adm := clients(t, s, nil)
	spec := putKey(t, adm, "k", 1)

	var (
		cause   error
		elapsed time.Duration
	)
	err := c.Hold(t.Context(), request(), func(ctx context.Context, l client.Lease) error {
		require.Equal(t, "k", l.KeyID)
		spec.Status = "disabled"
		if _, err := adm.PutKey(ctx, "k", spec); err != nil {
			return err
		}
		disabled := time.Now()
		select {
		case <-ctx.Done():
			elapsed, cause = time.Since(disabled), context.Cause(ctx)
			return ctx.Err()
		case <-time.After(maxRenewEvery + roundTrip):
			return errors.New("the work's ctx outlived a renewal interval after the key was disabled")
		}
	})
	require.ErrorIs(t, err, client.ErrLeaseLost, "Hold says the lease was lost")
	require.ErrorIs(t, cause, client.ErrLeaseLost)
	var e *client.Error
	require.ErrorAs(t, cause, &e, "lost by a renewal's answer, not by expiry: %v", cause)
	require.Equal(t, http.StatusGone, e.StatusCode)
	require.Less(t, elapsed, maxRenewEvery+roundTrip)
	require.Zero(t, liveLeases(t, adm, "k"))
}

// The service dies (killed, or frozen so that nothing answers) while a
// Hold works: the work's ctx is cancelled at the latest when the lease
// would have expired, and Hold returns, its report bounded too.
func TestHoldCancelsWhenServiceDies(t *testing.T) {
	for _, c := range []struct {
		name string
		die  func(*service) error
	}{
		{"killed", func(s *service) error { s.stop(); return nil }},
		{"frozen", (*service).freeze},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := start(t)
			opts := &client.Options{Timeout: roundTrip, ReportTimeout: roundTrip}
			cl, adm := clients(t, s, opts)
			putKey(t, adm, "k", 1)

			var cause error
			returned := make(chan error, 1)
			go func() {
				returned <- cl.Hold(context.Background(), request(), func(ctx context.Context, l client.Lease) error {
					if err := c.die(s); err != nil {
						return err
					}
					// The lease was granted or renewed before this point, so
					// it expires within testLease from now.
					select {
					case <-ctx.Done():
						cause = context.Cause(ctx)
						return ctx.Err()
					case <-time.After(testLease + roundTrip):
						return errors.New("the work's ctx outlived the lease")
					}
				})
			}()
			var err error
			select {
			case err = <-returned:
			case <-time.After(testLease + 3*roundTrip):
				t.Fatal("Hold hangs")
			}
			require.ErrorIs(t, cause, client.ErrLeaseLost, "%v", cause)
			require.ErrorContains(t, cause, "not renewed before it expired")
			require.ErrorIs(t, err, client.ErrLeaseLost)
			require.ErrorIs(t, err, client.ErrNotReported, "the report could not reach the service")

			ctx, cancel := context.WithTimeout(context.Background(), 2*roundTrip)
			defer cancel()
			_, err = cl.Allocate(ctx, request())
			require.ErrorIs(t, err, client.ErrUnreachable, "a call to a dead service fails, bounded by the client's Timeout")
		})
	}
}

// upstream answers every request with status and headers.
func upstream(t *testing.T, status int, header map[string]string) *http.Response {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		for k, v := range header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	resp, err := srv.Client().Get(srv.URL)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp
}

// The work's error decides the report, which releases the lease on every
// path: an upstream 429 cools the key down for its Retry-After, a 403
// disables it, a panic is reported and goes on.
func TestHoldReportsTheOutcome(t *testing.T) {
	s := start(t)
	c, adm := clients(t, s, nil)

	putKey(t, adm, "ok", 1)
	require.NoError(t, c.Hold(t.Context(), request(), func(context.Context, client.Lease) error { return nil }))
	require.Zero(t, liveLeases(t, adm, "ok"))

	err := c.Hold(t.Context(), request(), func(context.Context, client.Lease) error {
		return client.CheckResponse(upstream(t, http.StatusTooManyRequests, map[string]string{"Retry-After": "120"}))
	})
	var up *client.UpstreamError
	require.ErrorAs(t, err, &up, "Hold returns the work's error")
	k, err := adm.Key(t.Context(), "ok")
	require.NoError(t, err)
	require.Equal(t, "rate_limited", k.Status)
	require.NotNil(t, k.CooldownUntil)
	require.WithinDuration(t, time.Now().Add(120*time.Second), *k.CooldownUntil, 10*time.Second)
	require.Zero(t, k.LiveLeases)

	// Seconds past what a Duration holds: a day, the service's longest.
	putKey(t, adm, "long", 1)
	err = c.Hold(t.Context(), request(), func(context.Context, client.Lease) error {
		return client.CheckResponse(upstream(t, http.StatusTooManyRequests, map[string]string{"Retry-After": "10000000000"}))
	})
	require.ErrorAs(t, err, &up)
	require.NotErrorIs(t, err, client.ErrNotReported)
	k, err = adm.Key(t.Context(), "long")
	require.NoError(t, err)
	require.Equal(t, "rate_limited", k.Status)
	require.WithinDuration(t, time.Now().Add(24*time.Hour), *k.CooldownUntil, 10*time.Second)
	require.Zero(t, k.LiveLeases)

	putKey(t, adm, "auth", 1)
	err = c.Hold(t.Context(), request(), func(context.Context, client.Lease) error {
		return client.CheckResponse(upstream(t, http.StatusForbidden, nil))
	})
	require.ErrorAs(t, err, &up)
	k, err = adm.Key(t.Context(), "auth")
	require.NoError(t, err)
	require.Equal(t, "disabled", k.Status)
	require.Zero(t, k.LiveLeases)

	putKey(t, adm, "boom", 1)
	require.PanicsWithValue(t, "boom", func() {
		_ = c.Hold(t.Context(), request(), func(context.Context, client.Lease) error { panic("boom") })
	})
	require.Zero(t, liveLeases(t, adm, "boom"), "a panic releases the lease")

	// The caller gave up: released without a report, so nothing is counted
	// against the key.
	ctx, cancel := context.WithCancel(t.Context())
	err = c.Hold(ctx, request(), func(ctx context.Context, l client.Lease) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, client.ErrNotReported, "released although ctx was done")
	require.Zero(t, liveLeases(t, adm, "boom"))
	// The caller's deadline passed: the same, a release.
	ctx, cancel = context.WithTimeout(t.Context(), roundTrip)
	defer cancel()
	err = c.Hold(ctx, request(), func(ctx context.Context, l client.Lease) error {
		<-ctx.Done()
		return ctx.Err()
	})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NotErrorIs(t, err, client.ErrNotReported)
	require.Zero(t, liveLeases(t, adm, "boom"))
	metrics := scrape(t, s)
	for _, line := range []string{
		`credpool_reports_total{outcome="success"} 1`,
		`credpool_reports_total{outcome="rate_limited"} 2`,
		`credpool_reports_total{outcome="auth_error"} 1`,
		// The panic; the abandoned works are not counted against the key.
		`credpool_reports_total{outcome="error"} 1`,
		`credpool_releases_total{result="released",source="release"} 2`,
	} {
		require.Contains(t, metrics, line+"\n")
	}
}

// scrape reads the service's /metrics.
func scrape(t *testing.T, s *service) string {
	t.Helper()
	resp, err := http.Get(s.url + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}
