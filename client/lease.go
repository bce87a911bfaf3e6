package client

import (
	"context"
	"crypto/rand"
	"math"
	"time"
)

// Client calls the service's internal API (X-Internal-Key). It is safe
// for concurrent use.
type Client struct {
	conn
	opts Options
}

// New returns a Client of the service at baseURL (e.g.
// "http://127.0.0.1:8080") that sends internalKey. opts may be nil.
func New(baseURL, internalKey string, opts *Options) (*Client, error) {
	o := opts.withDefaults()
	c, err := newConn(baseURL, "X-Internal-Key", internalKey, o)
	if err != nil {
		return nil, err
	}
	return &Client{conn: c, opts: o}, nil
}

// AllocateRequest asks for a lease on a key of Provider that serves Model.
type AllocateRequest struct {
	Provider string
	// Model is the model to call; the service resolves aliases and
	// answers the canonical one in Lease.Model.
	Model string
	// Pool to take the key from; a pool may borrow from its fallbacks
	// (vip from default), never the reverse.
	//
	// default: "default"
	Pool string
	// Lease is how long the lease lasts unless renewed, rounded up to
	// whole seconds: 1s to the service's --max-lease.
	//
	// default: the service's, 35s
	Lease time.Duration
	// RequestID makes the allocation idempotent: the same provider and id
	// again, while its lease lives, answers that lease and takes no second
	// slot. Allocate sends one id on every try of one call.
	//
	// default: a random id per Allocate call
	RequestID string
	// Wait is how long the service may wait for a slot when every key is
	// full, in line with its other waiting callers, before answering
	// ErrPoolExhausted: up to 30s, capped by the service's request
	// timeout. Each try's HTTP timeout grows by it.
	//
	// default: 0, answer at once
	Wait time.Duration
}

// LeaseRef names a lease: what Renew, Release and Report need.
type LeaseRef struct {
	Provider string
	// Pool is the pool that granted the lease (a vip request may be served
	// from default).
	Pool    string
	KeyID   string
	LeaseID string
}

// Lease is a granted lease.
type Lease struct {
	LeaseRef
	// FencingToken grows with every grant of the key: pass it downstream
	// to reject a stale holder.
	FencingToken int64
	// Model is the canonical model, the one to send upstream.
	Model string
	// Until is when the lease expires unless renewed, by the service's
	// clock.
	Until time.Time
	// Credential is the key's secret; it prints redacted.
	Credential Credential
	// RequestID is the id the allocation was sent with.
	RequestID string
}

type allocateBody struct {
	Provider     string `json:"provider"`
	Model        string `json:"model"`
	Pool         string `json:"pool,omitempty"`
	LeaseSeconds int    `json:"lease_seconds,omitempty"`
	RequestID    string `json:"request_id"`
	WaitMs       int64  `json:"wait_ms,omitempty"`
}

type leaseBody struct {
	Provider string `json:"provider"`
	Pool     string `json:"pool"`
	KeyID    string `json:"key_id"`
	LeaseID  string `json:"lease_id"`
}

func bodyOf(r LeaseRef) leaseBody { return leaseBody(r) }

// seconds rounds d up to whole seconds; 0 stays 0 (the default).
func seconds(d time.Duration) int {
	return int(math.Ceil(d.Seconds()))
}

// newRequestID is 130 random bits in base32 (A-Z, 2-7): a valid id,
// never reused.
func newRequestID() string { return rand.Text() }

// Allocate leases a key. Errors: ErrPoolExhausted (with the *Error's
// RetryAfter), ErrContended, ErrNoCandidates, ErrPolicyConflict,
// ErrRequestInFlight, ErrRequestIDReused, ErrStoreUnavailable,
// ErrCatalogUnavailable, ErrTimeout, ErrShuttingDown, ErrInvalidRequest,
// ErrUnauthorized, ErrUnreachable, or ctx's error. With Options.Retry,
// ErrPoolExhausted with a RetryAfter, ErrContended, ErrRequestInFlight,
// ErrShuttingDown, ErrUnreachable, ErrTimeout and ErrStoreUnavailable are
// retried (see Retry) with the same request id, so however many tries it takes
// the call holds at most one slot, and a lease whose answer was lost is
// the one a retry returns. On error no lease is held, except one whose
// answer was lost and not recovered by a retry: it expires by itself.
func (c *Client) Allocate(ctx context.Context, req AllocateRequest) (Lease, error) {
	l, _, err := c.allocate(ctx, req)
	return l, err
}

// allocate is Allocate that also says when the try that was granted was
// sent: the lease cannot end before that plus its length.
func (c *Client) allocate(ctx context.Context, req AllocateRequest) (Lease, time.Time, error) {
	if req.RequestID == "" {
		req.RequestID = newRequestID()
	}
	body := allocateBody{
		Provider: req.Provider, Model: req.Model, Pool: req.Pool,
		LeaseSeconds: seconds(req.Lease), RequestID: req.RequestID, WaitMs: req.Wait.Milliseconds(),
	}
	conn := c.conn
	conn.timeout += req.Wait
	var (
		l    Lease
		sent time.Time
	)
	err := c.opts.Retry.do(ctx, func() error {
		var out struct {
			KeyID         string    `json:"key_id"`
			LeaseID       string    `json:"lease_id"`
			FencingToken  int64     `json:"fencing_token"`
			Pool          string    `json:"pool"`
			ProviderModel string    `json:"provider_model"`
			LeaseUntil    time.Time `json:"lease_until"`
			Credential    struct {
				APIKey string `json:"api_key"`
			} `json:"credential"`
		}
		sent = time.Now()
		if err := conn.do(ctx, "POST", "/api/internal/allocate-key", body, &out); err != nil {
			return err
		}
		l = Lease{
			LeaseRef:     LeaseRef{Provider: req.Provider, Pool: out.Pool, KeyID: out.KeyID, LeaseID: out.LeaseID},
			FencingToken: out.FencingToken, Model: out.ProviderModel, Until: out.LeaseUntil,
			Credential: Credential{APIKey: Secret(out.Credential.APIKey)}, RequestID: req.RequestID,
		}
		return nil
	})
	return l, sent, err
}

// Renew extends the lease to d from now (rounded up to whole seconds; 0:
// the service's default, 35s) and returns its new expiry. ErrLeaseLost
// means the lease is gone and is never recreated: stop using the
// credential. On any other error the lease keeps its previous expiry.
func (c *Client) Renew(ctx context.Context, ref LeaseRef, d time.Duration) (time.Time, error) {
	body := struct {
		leaseBody
		LeaseSeconds int `json:"lease_seconds,omitempty"`
	}{bodyOf(ref), seconds(d)}
	var out struct {
		LeaseUntil time.Time `json:"lease_until"`
	}
	if err := c.do(ctx, "POST", "/api/internal/renew", body, &out); err != nil {
		return time.Time{}, err
	}
	return out.LeaseUntil, nil
}

// Release gives the lease back without a report. It is idempotent: nil
// means this call released it, ErrLeaseLost that there was nothing to
// release (unknown, released, expired), ErrLeaseMismatch that the lease
// belongs to another provider or pool and was left alone.
func (c *Client) Release(ctx context.Context, ref LeaseRef) error {
	return c.released(ctx, "/api/internal/release", bodyOf(ref))
}

// Outcome is how the work with a lease went, as Report tells the service.
type Outcome string

// Outcomes of Report.
const (
	// Success counts for the key's success rate.
	Success Outcome = "success"
	// Failure counts against it: the call failed in a way that may be the
	// key's.
	Failure Outcome = "error"
	// RateLimited puts the key in a cooldown (the upstream's Retry-After).
	RateLimited Outcome = "rate_limited"
	// AuthError disables the key: the upstream refused it.
	AuthError Outcome = "auth_error"
)

// maxRetryAfter is the longest cooldown the service takes.
const maxRetryAfter = 86400 * time.Second

// Report tells the service how the work went and releases the lease.
// retryAfter is the cooldown of RateLimited (0: the service's default,
// 60s; at most 24h) and ignored otherwise. Errors as Release's: a report
// for a lease not held counts nothing. A report that failed (ErrUnreachable,
// a 503) can simply be sent again: it counts once.
func (c *Client) Report(ctx context.Context, ref LeaseRef, o Outcome, retryAfter time.Duration) error {
	body := struct {
		leaseBody
		Outcome           Outcome `json:"outcome"`
		RetryAfterSeconds int     `json:"retry_after_seconds,omitempty"`
	}{leaseBody: bodyOf(ref), Outcome: o}
	if o == RateLimited {
		body.RetryAfterSeconds = seconds(min(retryAfter, maxRetryAfter))
	}
	return c.released(ctx, "/api/internal/report", body)
}

// released sends a release or report and reads its answer.
func (c *Client) released(ctx context.Context, path string, body any) error {
	var out struct {
		Released bool   `json:"released"`
		Reason   string `json:"reason"`
	}
	if err := c.do(ctx, "POST", path, body, &out); err != nil {
		return err
	}
	switch {
	case out.Released:
		return nil
	case out.Reason == "owner_mismatch":
		return ErrLeaseMismatch
	default:
		return ErrLeaseLost
	}
}
