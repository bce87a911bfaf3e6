package client

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// Retry makes Allocate retry the answers that say "try again soon":
// pool_exhausted with a Retry-After (without one nothing frees up by
// itself, so it is returned at once), contended, request_in_flight and
// shutting_down (a wait the instance's shutdown ended: another may serve);
// and those after which the service may have granted a slot the caller
// never heard of: no answer (ErrUnreachable), 503 timeout and
// store_unavailable. Every try of one call sends the same request id, so
// a retry never takes a second slot: after a lost answer it gets the very
// lease that answer carried, while that lease lives. Pauses double from MinBackoff to MaxBackoff with ±50%
// jitter, and are never shorter than the answer's Retry-After (plus up to
// 20% jitter, so that callers told the same second do not come back
// together). A pause that would end past the deadline (MaxElapsed, or
// ctx's) is not taken: the last answer is returned at once. A nil *Retry
// never retries. A Retry is read, never written, so one may be shared.
type Retry struct {
	// MaxAttempts bounds the tries of one call, the first included.
	//
	// default: 10
	MaxAttempts int
	// MaxElapsed bounds the time one call may spend, tries and pauses
	// included; ctx's deadline, if sooner, bounds it too.
	//
	// default: 30s
	MaxElapsed time.Duration
	// MinBackoff is the first pause.
	//
	// default: 100ms
	MinBackoff time.Duration
	// MaxBackoff caps the doubling pauses (not a Retry-After).
	//
	// default: 5s
	MaxBackoff time.Duration
	// OnRetry, if set, is called before each pause with the answer that
	// caused it and the pause: for metrics and logs.
	OnRetry func(err error, pause time.Duration)
}

// retryable reports whether err says to try again, and the least wait.
func retryable(err error) (time.Duration, bool) {
	var e *Error
	if !errors.As(err, &e) {
		return 0, errors.Is(err, ErrUnreachable)
	}
	switch {
	case errors.Is(e, ErrPoolExhausted):
		return e.RetryAfter, e.RetryAfter > 0
	case errors.Is(e, ErrContended), errors.Is(e, ErrRequestInFlight), errors.Is(e, ErrShuttingDown),
		errors.Is(e, ErrTimeout), errors.Is(e, ErrStoreUnavailable),
		errors.Is(e, ErrUnreachable): // a proxy's 502, 503, 504
		return e.RetryAfter, true
	}
	return 0, false
}

// do runs try until it succeeds, fails for good, or the bounds are spent.
func (r *Retry) do(ctx context.Context, try func() error) error {
	if r == nil {
		return try()
	}
	attempts, elapsed := r.MaxAttempts, r.MaxElapsed
	lo, hi := r.MinBackoff, r.MaxBackoff
	if attempts < 1 {
		attempts = 10
	}
	if elapsed <= 0 {
		elapsed = 30 * time.Second
	}
	if lo <= 0 {
		lo = 100 * time.Millisecond
	}
	if hi <= 0 {
		hi = 5 * time.Second
	}
	hi = max(hi, lo)
	deadline := time.Now().Add(elapsed)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	backoff := lo
	for n := 1; ; n++ {
		err := try()
		after, ok := retryable(err)
		if !ok || n >= attempts {
			return err
		}
		pause := backoff/2 + rand.N(backoff+1)
		if after > 0 {
			pause = max(pause, after+rand.N(after/5+1))
		}
		if time.Now().Add(pause).After(deadline) {
			return err
		}
		if r.OnRetry != nil {
			r.OnRetry(err, pause)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-t.C:
		}
		backoff = min(2*backoff, hi)
	}
}
