package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Options configure a Client or an Admin. A nil *Options means defaults.
type Options struct {
	// HTTPClient sends the requests. Its own Timeout, if any, applies on
	// top of Timeout. One that follows redirects sends the key header
	// (X-Internal-Key, X-Admin-Key) to wherever they lead, another host
	// too: the default follows none (a redirect is an *Error).
	//
	// default: a client of its own over a clone of http.DefaultTransport
	// (over http.DefaultTransport itself if the application replaced it
	// with a RoundTripper that is not an *http.Transport)
	HTTPClient *http.Client
	// Timeout bounds one HTTP request, so that a service gone silent
	// cannot hold a call (or Hold's renewals) forever. The service's own
	// deadline per request is 10s.
	//
	// default: 15s
	Timeout time.Duration
	// Retry, if set, makes Allocate (and so Hold) retry pool_exhausted,
	// contended, request_in_flight and shutting_down answers, and those
	// that may hide a granted slot (no answer, a 503 timeout or
	// store_unavailable), with one request id.
	//
	// default: nil, no retry
	Retry *Retry
	// RenewFraction is the part of a lease that Hold waits between
	// renewals, jittered by ±20%, but never later than a fifth of the lease
	// before it expires. A failed renewal is tried again after a quarter
	// of that, until the lease would have expired.
	//
	// default: 1/3
	RenewFraction float64
	// ReportTimeout bounds Hold's report after the work returned, resends
	// included (a report that got no answer, or a 503 or contended one, is
	// sent again with jittered backoff). The report runs even when the
	// caller's ctx is done.
	//
	// default: 5s
	ReportTimeout time.Duration
}

// Defaults of Options.
const (
	defaultTimeout       = 15 * time.Second
	defaultRenewFraction = 1.0 / 3
	defaultReportTimeout = 5 * time.Second
	// maxAnswer bounds an answer's body: the admin list of many keys is
	// the largest.
	maxAnswer = 64 << 20
)

func (o *Options) withDefaults() Options {
	var out Options
	if o != nil {
		out = *o
	}
	if out.HTTPClient == nil {
		// A clone, so that the client's connections are its own; a
		// transport the application wrapped (tracing, a proxy) is kept.
		rt := http.DefaultTransport
		if t, ok := rt.(*http.Transport); ok {
			rt = t.Clone()
		}
		out.HTTPClient = &http.Client{Transport: rt, CheckRedirect: noRedirects}
	}
	if out.Timeout <= 0 {
		out.Timeout = defaultTimeout
	}
	if out.RenewFraction <= 0 || out.RenewFraction >= 1 {
		out.RenewFraction = defaultRenewFraction
	}
	if out.ReportTimeout <= 0 {
		out.ReportTimeout = defaultReportTimeout
	}
	return out
}

// noRedirects answers a redirect with itself: followed, it would carry the
// key header to another host.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// conn sends JSON requests with one key header to one service.
type conn struct {
	base    string // scheme://host[:port][/prefix], no trailing slash
	header  string
	key     string
	http    *http.Client
	timeout time.Duration
}

func newConn(baseURL, header, key string, o Options) (conn, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return conn{}, fmt.Errorf("client: base URL: want http(s)://host[:port]")
	}
	if key == "" {
		return conn{}, fmt.Errorf("client: no %s", header)
	}
	return conn{
		base: strings.TrimSuffix(u.String(), "/"), header: header, key: key,
		http: o.HTTPClient, timeout: o.Timeout,
	}, nil
}

// do sends in (nil: no body) as JSON and decodes a 2xx answer into out
// (nil: discarded). Any other answer is an *Error. No answer is
// ErrOutcomeUnknown if a connection was made (the request may have been
// read), and ErrUnreachable while ctx is live, or ctx's error once it
// is done.
func (c conn) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		raw, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("client: %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(raw)
	}
	rctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	// Whether a connection was asked for, and got: once one is, the
	// request may reach the service however the call ends. A transport
	// that does not trace asks for none, and is taken to have sent it,
	// unless ctx ended (net/http then gives up before it asks).
	var asked, connected atomic.Bool
	rctx = httptrace.WithClientTrace(rctx, &httptrace.ClientTrace{
		GetConn: func(string) { asked.Store(true) },
		GotConn: func(httptrace.GotConnInfo) { connected.Store(true) },
	})
	req, err := http.NewRequestWithContext(rctx, method, c.base+path, body)
	if err != nil {
		return fmt.Errorf("client: %s %s: %w", method, path, err)
	}
	req.Header.Set(c.header, c.key)
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err == nil {
		defer resp.Body.Close()
		var raw []byte
		if raw, err = io.ReadAll(io.LimitReader(resp.Body, maxAnswer)); err == nil {
			return answer(resp, raw, out)
		}
	}
	sent := connected.Load() || !asked.Load()
	switch {
	case ctx.Err() != nil && connected.Load():
		// The caller gave up: not the service's failure. Keep both causes.
		return fmt.Errorf("%w: %s %s: %w", ErrOutcomeUnknown, method, path, errors.Join(err, ctx.Err()))
	case ctx.Err() != nil:
		return fmt.Errorf("client: %s %s: %w", method, path, errors.Join(err, ctx.Err()))
	case sent:
		return unanswered{fmt.Errorf("%w: %s %s: %w", ErrOutcomeUnknown, method, path, err)}
	}
	return fmt.Errorf("%w: %s %s: %w", ErrUnreachable, method, path, err)
}

// answer decodes a reply: 2xx into out, anything else into an *Error.
func answer(resp *http.Response, raw []byte, out any) error {
	if resp.StatusCode/100 == 2 {
		if out == nil {
			return nil
		}
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("client: %d answer: %w", resp.StatusCode, err)
		}
		return nil
	}
	e := &Error{StatusCode: resp.StatusCode}
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			Field   string `json:"field"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &body) == nil {
		e.Code, e.Message, e.Field = body.Error.Code, body.Error.Message, body.Error.Field
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	return e
}
