package handlers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/optimistic"
)

// Request limits: the default lease length and the longest retry_after,
// in seconds, and the longest wait_ms.
const (
	defaultLeaseSeconds = 35
	maxRetryAfter       = 86400
	maxWaitMs           = 30000
)

type internalAPI struct {
	svc Service
	m   *Metrics
	// maxLease bounds lease_seconds, in whole seconds.
	maxLease int
}

type allocateRequest struct {
	Provider     string `json:"provider"`
	Model        string `json:"model"`
	Pool         string `json:"pool"`
	LeaseSeconds *int   `json:"lease_seconds"`
	RequestID    string `json:"request_id"`
	WaitMs       int    `json:"wait_ms"`
}

type allocateResponse struct {
	KeyID         string     `json:"key_id"`
	LeaseID       string     `json:"lease_id"`
	FencingToken  int64      `json:"fencing_token"`
	Pool          string     `json:"pool"`
	ProviderModel string     `json:"provider_model"`
	LeaseUntil    time.Time  `json:"lease_until"`
	Credential    credential `json:"credential"`
}

type credential struct {
	APIKey string `json:"api_key"`
}

func (a internalAPI) allocate(c *gin.Context) {
	var req allocateRequest
	if !decode(c, &req) {
		return
	}
	if req.Pool == "" {
		req.Pool = "default"
	}
	ttl, ok := a.leaseTTL(c, req.LeaseSeconds)
	if !ok || !validID(c, "provider", req.Provider) || !validID(c, "pool", req.Pool) {
		return
	}
	if catalog.CheckModel("model", req.Model) != nil {
		invalid(c, "model", modelRule)
		return
	}
	if req.RequestID != "" && !validID(c, "request_id", req.RequestID) {
		return
	}
	if req.WaitMs < 0 || req.WaitMs > maxWaitMs {
		invalid(c, "wait_ms", fmt.Sprintf("want 0 to %d", maxWaitMs))
		return
	}
	ctx := c.Request.Context()
	start := time.Now()
	wait := waitFor(ctx, time.Duration(req.WaitMs)*time.Millisecond)
	g, err := a.svc.Allocate(ctx, broker.Request{
		Provider: req.Provider, Model: req.Model, Pool: req.Pool, TTL: ttl, RequestID: req.RequestID, Wait: wait,
	})
	if err == nil && ctx.Err() != nil {
		// Granted as the caller hung up, or as the deadline passed: nobody
		// would use or release the lease, so it goes back now rather than
		// at its expiry.
		a.giveBack(ctx, g.LeaseRef)
		err = ctx.Err()
	}
	a.m.observeAllocate(err, g.Stats, time.Since(start), wait > 0)
	if err != nil {
		failErr(c, err)
		return
	}
	c.Set(logKeyID, g.KeyID)
	c.Set(logLeaseID, g.LeaseID)
	c.JSON(http.StatusOK, allocateResponse{
		KeyID: g.KeyID, LeaseID: g.LeaseID, FencingToken: g.Fence, Pool: g.Pool,
		ProviderModel: g.Model, LeaseUntil: g.Until.UTC(),
		Credential: credential{APIKey: g.Secret.Reveal()},
	})
}

// giveBackTimeout bounds the release of a lease nobody took.
const giveBackTimeout = 5 * time.Second

// giveBack releases a granted lease that no caller will take, after the
// request's ctx ended.
func (a internalAPI) giveBack(ctx context.Context, ref optimistic.LeaseRef) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
	defer cancel()
	_ = a.svc.Release(ctx, ref)
}

// leaseRequest names a lease; release, renew and report all carry it.
type leaseRequest struct {
	Provider string `json:"provider"`
	Pool     string `json:"pool"`
	KeyID    string `json:"key_id"`
	LeaseID  string `json:"lease_id"`
}

// ref validates the four ids, writing a 400 naming the first bad one.
func (l leaseRequest) ref(c *gin.Context) (optimistic.LeaseRef, bool) {
	ok := validID(c, "provider", l.Provider) && validID(c, "pool", l.Pool) &&
		validID(c, "key_id", l.KeyID) && validID(c, "lease_id", l.LeaseID)
	if ok {
		c.Set(logKeyID, l.KeyID)
		c.Set(logLeaseID, l.LeaseID)
	}
	return optimistic.LeaseRef{Provider: l.Provider, Pool: l.Pool, KeyID: l.KeyID, LeaseID: l.LeaseID}, ok
}

// releaseResponse says whether the lease was released, and if not why:
// "not_found_or_expired" (unknown, already released, expired; nothing to
// do) or "owner_mismatch" (it belongs to another provider or pool).
type releaseResponse struct {
	Released bool   `json:"released"`
	Reason   string `json:"reason,omitempty"`
}

func (a internalAPI) release(c *gin.Context) {
	var req leaseRequest
	if !decode(c, &req) {
		return
	}
	ref, ok := req.ref(c)
	if !ok {
		return
	}
	a.released(c, "release", a.svc.Release(c.Request.Context(), ref))
}

// released writes the outcome of a release (or of the release that ends a
// report): 200 with released true or false and the reason, or the error.
func (a internalAPI) released(c *gin.Context, op string, err error) {
	resp := releaseResponse{Released: err == nil}
	switch {
	case errors.Is(err, optimistic.ErrLeaseMismatch):
		resp.Reason = "owner_mismatch"
	case errors.Is(err, optimistic.ErrLeaseLost):
		resp.Reason = "not_found_or_expired"
	case err != nil:
		a.m.releases.WithLabelValues(op, "error").Inc()
		failErr(c, err)
		return
	}
	a.m.releases.WithLabelValues(op, resultOf(resp)).Inc()
	c.JSON(http.StatusOK, resp)
}

func resultOf(r releaseResponse) string {
	if r.Released {
		return "released"
	}
	return r.Reason
}

type renewRequest struct {
	leaseRequest
	LeaseSeconds *int `json:"lease_seconds"`
}

func (a internalAPI) renew(c *gin.Context) {
	var req renewRequest
	if !decode(c, &req) {
		return
	}
	ref, ok := req.ref(c)
	if !ok {
		return
	}
	ttl, ok := a.leaseTTL(c, req.LeaseSeconds)
	if !ok {
		return
	}
	until, err := a.svc.Renew(c.Request.Context(), ref, ttl)
	a.m.renewals.WithLabelValues(resultLabel(err, "renewed")).Inc()
	if err != nil {
		failErr(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"lease_until": until.UTC()})
}

type reportRequest struct {
	leaseRequest
	Outcome           catalog.Outcome `json:"outcome"`
	RetryAfterSeconds *int            `json:"retry_after_seconds"`
}

func (a internalAPI) report(c *gin.Context) {
	var req reportRequest
	if !decode(c, &req) {
		return
	}
	ref, ok := req.ref(c)
	if !ok {
		return
	}
	if !req.Outcome.Valid() {
		invalid(c, "outcome", "want success, error, rate_limited or auth_error")
		return
	}
	var retry time.Duration
	if req.RetryAfterSeconds != nil {
		if s := *req.RetryAfterSeconds; s < 0 || s > maxRetryAfter {
			invalid(c, "retry_after_seconds", "want 0 to 86400")
			return
		}
		retry = time.Duration(*req.RetryAfterSeconds) * time.Second
	}
	a.m.reports.WithLabelValues(string(req.Outcome)).Inc()
	a.released(c, "report", a.svc.Report(c.Request.Context(), ref, req.Outcome, retry))
}

// waitFor is how long an allocate asking to wait may wait: at most until
// a tenth of the time left before the request's deadline, kept for the
// try in progress when the wait ends (no try starts after it), so that a
// wait that runs out is a 429, not a timeout.
func waitFor(ctx context.Context, wait time.Duration) time.Duration {
	if dl, ok := ctx.Deadline(); ok && wait > 0 {
		left := time.Until(dl)
		wait = max(min(wait, left-left/10), 0)
	}
	return wait
}

// leaseTTL reads lease_seconds: default 35 (or the maximum if lower), 1 to
// the maximum lease.
func (a internalAPI) leaseTTL(c *gin.Context, secs *int) (time.Duration, bool) {
	if secs == nil {
		return time.Duration(min(defaultLeaseSeconds, a.maxLease)) * time.Second, true
	}
	if *secs < 1 || *secs > a.maxLease {
		invalid(c, "lease_seconds", fmt.Sprintf("want 1 to %d", a.maxLease))
		return 0, false
	}
	return time.Duration(*secs) * time.Second, true
}

// validID writes a 400 naming field unless v is a well-formed id.
func validID(c *gin.Context, field, v string) bool {
	if optimistic.ValidID(v) {
		return true
	}
	if v == "" {
		invalid(c, field, "required")
	} else {
		invalid(c, field, "want 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit")
	}
	return false
}
