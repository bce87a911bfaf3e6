package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/client"
	"github.com/credpool/credpool/test/openapitest"
)

// Paths whose requests the tests count and fault.
const (
	allocatePath = "/api/internal/allocate-key"
	renewPath    = "/api/internal/renew"
	reportPath   = "/api/internal/report"
)

// fault is what faulty does to one request.
type fault int

const (
	// pass sends the request and returns its answer.
	pass fault = iota
	// refuse answers 503 store_unavailable without sending the request.
	refuse
	// drop sends the request, then loses its answer, as a cut connection.
	drop
	// behind sends the request and moves the answer's lease_until back by
	// faulty.skew, as from a service whose clock runs behind.
	behind
	// abandon sends the request, then the caller gives up (faulty.giveUp)
	// before its answer is read.
	abandon
)

// faulty is a RoundTripper over next that counts the requests of each
// path and does to the nth of a path what fault says. It is safe for
// concurrent use.
type faulty struct {
	next   http.RoundTripper
	fault  func(path string, n int) fault
	skew   time.Duration
	giveUp context.CancelFunc

	mu      sync.Mutex
	sent    map[string]int
	dropped []map[string]any // the answers lost, decoded
}

// withFaults returns options whose client sends through a new faulty,
// under the OpenAPI validation (so faulty's own answers are checked too).
func withFaults(o client.Options, fault func(path string, n int) fault) (*client.Options, *faulty) {
	f := &faulty{next: plain, fault: fault, sent: map[string]int{}}
	o.HTTPClient = &http.Client{Transport: openapitest.Transport(f)}
	return &o, f
}

// count is how many requests of path were sent (or refused).
func (f *faulty) count(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sent[path]
}

func (f *faulty) RoundTrip(req *http.Request) (*http.Response, error) {
	f.mu.Lock()
	f.sent[req.URL.Path]++
	what := f.fault(req.URL.Path, f.sent[req.URL.Path])
	f.mu.Unlock()
	if what == refuse {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return &http.Response{
			StatusCode: http.StatusServiceUnavailable, Request: req,
			Header: http.Header{"Content-Type": {"application/json; charset=utf-8"}},
			Body:   io.NopCloser(strings.NewReader(`{"error":{"code":"store_unavailable","message":"the lease store is unavailable; retry later"}}`)),
		}, nil
	}
	resp, err := f.next.RoundTrip(req)
	if err != nil || what == pass {
		return resp, err
	}
	if what == abandon {
		_ = resp.Body.Close()
		f.giveUp()
		return nil, req.Context().Err()
	}
	raw, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, err
	}
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		return nil, err
	}
	if what == drop {
		f.mu.Lock()
		f.dropped = append(f.dropped, body)
		f.mu.Unlock()
		return nil, errors.New("connection reset by the test")
	}
	if until, ok := body["lease_until"].(string); ok {
		t, err := time.Parse(time.RFC3339Nano, until)
		if err != nil {
			return nil, err
		}
		body["lease_until"] = t.Add(-f.skew).Format(time.RFC3339Nano)
	}
	if raw, err = json.Marshal(body); err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(raw))
	resp.ContentLength = int64(len(raw))
	resp.Header.Del("Content-Length")
	return resp, nil
}

// Renewals keep the lease alive: held for two lease lengths, the work's
// ctx is live, the key has exactly one live lease, and renewals went out.
// With a RenewFraction near 1 too: the renewal is then sent before the
// lease's last fifth, not after it died. The lease is longer than
// testLease so that its last fifth (2s) outlasts a renewal's commit
// stalled by a busy disk.
func TestHoldRenewalsKeepTheLease(t *testing.T) {
	const lease = 10 * time.Second
	for name, fraction := range map[string]float64{"default": 0, "0.99": 0.99} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := start(t)
			opts, f := withFaults(client.Options{RenewFraction: fraction}, func(string, int) fault { return pass })
			c, adm := clients(t, s, opts)
			putKey(t, adm, "k", 2)
			req := request()
			req.Lease = lease
			err := c.Hold(t.Context(), req, func(ctx context.Context, l client.Lease) error {
				select {
				case <-ctx.Done():
					return context.Cause(ctx)
				case <-time.After(2 * lease):
				}
				require.NoError(t, ctx.Err())
				require.Equal(t, 1, liveLeases(t, adm, "k"))
				return nil
			})
			require.NoError(t, err)
			require.GreaterOrEqual(t, f.count(renewPath), 2, "at least one renewal per lease length")
			require.Zero(t, liveLeases(t, adm, "k"))
		})
	}
}

// An allocate whose answer is lost may have taken a slot: with Retry it is
// sent again with the same request id, and the caller gets the lease the
// lost answer carried, not a second one.
func TestAllocateRetryGetsTheLeaseOfALostAnswer(t *testing.T) {
	s := start(t)
	opts, f := withFaults(client.Options{Retry: &client.Retry{MaxElapsed: time.Minute}}, func(path string, n int) fault {
		if path == allocatePath && n == 1 {
			return drop
		}
		return pass
	})
	c, adm := clients(t, s, opts)
	putKey(t, adm, "k", 2)
	l, err := c.Allocate(t.Context(), request())
	require.NoError(t, err)
	require.Equal(t, 2, f.count(allocatePath), "the lost answer's request was sent again")
	require.Len(t, f.dropped, 1)
	require.Equal(t, f.dropped[0]["lease_id"], l.LeaseID, "the caller got the lease of the lost answer")
	require.Equal(t, 1, liveLeases(t, adm, "k"), "and holds one slot")
}

// Hold's report is sent again when it got a 503, or no answer: the
// outcome is counted, once, and the lease released.
func TestHoldResendsItsReport(t *testing.T) {
	s := start(t)
	for _, first := range []fault{refuse, drop} {
		opts, f := withFaults(client.Options{ReportTimeout: 4 * roundTrip}, func(path string, n int) fault {
			if path == reportPath && n == 1 {
				return first
			}
			return pass
		})
		c, adm := clients(t, s, opts)
		id := map[fault]string{refuse: "refused", drop: "dropped"}[first]
		putKey(t, adm, id, 1)
		require.NoError(t, c.Hold(t.Context(), request(), func(context.Context, client.Lease) error { return nil }), id)
		require.GreaterOrEqual(t, f.count(reportPath), 2, id)
		require.Zero(t, liveLeases(t, adm, id), id)
		// The service writes counters behind, within seconds.
		require.Eventually(t, func() bool {
			k, err := adm.Key(t.Context(), id)
			return err == nil && k.Successes == 1
		}, 5*roundTrip, 50*time.Millisecond, "%s: the success is counted", id)
		require.NoError(t, adm.DeleteKey(t.Context(), id))
	}
}

// The lease's length is taken from every renewal's answer: a grant whose
// lease_until says far less than asked (an instance whose clock runs
// behind) makes the first renewal early, not every renewal.
func TestHoldTakesEachRenewalsLength(t *testing.T) {
	s := start(t)
	opts, f := withFaults(client.Options{}, func(path string, n int) fault {
		if path == allocatePath {
			return behind
		}
		return pass
	})
	f.skew = testLease - 600*time.Millisecond
	c, adm := clients(t, s, opts)
	putKey(t, adm, "k", 1)
	err := c.Hold(t.Context(), request(), func(ctx context.Context, l client.Lease) error {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(testLease):
			return nil
		}
	})
	require.NoError(t, err)
	// Early once (a third of 600ms, at least 200ms), then every third of
	// testLease: about 3 in testLease. Kept at the first answer's length,
	// it would be 15.
	require.Positive(t, f.count(renewPath))
	require.LessOrEqual(t, f.count(renewPath), 6)
}

// A write whose answer was lost may have been applied: it is
// ErrOutcomeUnknown and says so, never "unreachable"; while the caller's
// ctx is live it matches ErrUnreachable too (retry it), once it is done
// ctx's error instead. Only a request that found no connection, so was
// never sent, is ErrUnreachable alone and says "unreachable".
func TestAdminWriteWithoutAnswer(t *testing.T) {
	s := start(t)
	ctx, giveUp := context.WithCancel(t.Context())
	defer giveUp()
	opts, f := withFaults(client.Options{}, func(path string, _ int) fault {
		switch path {
		case "/api/admin/keys/dropped":
			return drop
		case "/api/admin/keys/abandoned":
			return abandon
		}
		return pass
	})
	f.giveUp = giveUp
	_, adm := clients(t, s, opts)
	spec := client.KeySpec{Provider: "openai", Pool: "default", Models: []string{"gpt-4o-2024-08-06"}, Secret: "sk-lost"}

	_, err := adm.PutKey(t.Context(), "dropped", spec)
	require.ErrorIs(t, err, client.ErrOutcomeUnknown)
	require.ErrorIs(t, err, client.ErrUnreachable, "retryable")
	require.NotContains(t, err.Error(), "unreachable")

	_, err = adm.PutKey(ctx, "abandoned", spec)
	require.ErrorIs(t, err, client.ErrOutcomeUnknown)
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, client.ErrUnreachable, "the caller gave up: not the service's failure")

	// A call whose ctx was over before it started sent nothing.
	over, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = adm.PutKey(over, "never-sent", spec)
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, client.ErrOutcomeUnknown, "nothing was sent")

	_, direct := clients(t, s, nil)
	_, err = direct.Key(t.Context(), "never-sent")
	require.ErrorIs(t, err, client.ErrKeyNotFound)
	for _, id := range []string{"dropped", "abandoned"} {
		k, err := direct.Key(t.Context(), id)
		require.NoError(t, err, "the write of %s was applied", id)
		require.Equal(t, "openai", k.Provider)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, l.Close())
	gone, err := client.NewAdmin("http://"+l.Addr().String(), adminKey, nil)
	require.NoError(t, err)
	_, err = gone.PutKey(t.Context(), "never", spec)
	require.ErrorIs(t, err, client.ErrUnreachable)
	require.NotErrorIs(t, err, client.ErrOutcomeUnknown, "no connection: nothing was sent")
	require.ErrorContains(t, err, "unreachable")

	// A proxy's own 502, 503 or 504 may hide an answer as well.
	for _, code := range []int{http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout} {
		err := &client.Error{StatusCode: code}
		require.ErrorIs(t, err, client.ErrOutcomeUnknown, "%d", code)
		require.ErrorIs(t, err, client.ErrUnreachable, "%d", code)
	}
	require.NotErrorIs(t, &client.Error{StatusCode: http.StatusServiceUnavailable, Code: "catalog_unavailable"}, client.ErrOutcomeUnknown)
}
