package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// defaultLease is the service's lease when the request names none.
const defaultLease = 35 * time.Second

// Hold allocates a lease (retrying as Options.Retry says), runs work with
// it, and reports how the work went, which releases the lease, on every
// return path: work returning, and work panicking (reported as Failure,
// then the panic goes on). While work runs, the lease is renewed in the
// background every Options.RenewFraction of its length (jittered); work's
// ctx is cancelled, with a cause matching ErrLeaseLost (read it with
// context.Cause), as soon as a renewal answers that the lease is lost, or
// when the lease would have expired by this process's clock because no
// renewal got through (the service is down or unreachable). Work must
// stop using the credential once its ctx is done.
//
// work's error decides the report (see OutcomeOf): return CheckResponse's
// error, or an *UpstreamError, for an upstream's 429 or 401/403. If the
// caller's ctx ended and work failed with a context error, the caller gave
// up, which says nothing about the key: the lease is released without a
// report. The report (or release) is sent even after ctx is done, and
// sent again while it gets no answer or a 503 or contended one, within
// Options.ReportTimeout.
//
// Hold returns Allocate's error if there was no lease, else work's error,
// joined with the ErrLeaseLost cause if the lease was lost while work ran
// (or found gone by the report), and with ErrNotReported if the report
// failed.
func (c *Client) Hold(ctx context.Context, req AllocateRequest, work func(ctx context.Context, l Lease) error) (err error) {
	l, sent, err := c.allocate(ctx, req)
	if err != nil {
		return err
	}
	life := lifetime(req.Lease, l.Until, sent)
	wctx, lose := context.WithCancelCause(ctx)
	defer lose(nil)
	kctx, stopKeep := context.WithCancel(wctx)
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		c.keep(kctx, lose, l.LeaseRef, req.Lease, life, sent.Add(life))
	}()

	panicked := true
	defer func() {
		stopKeep()
		<-kept
		outcome, cool := Failure, time.Duration(0)
		switch {
		case panicked:
		case ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
			outcome = "" // the caller gave up
		default:
			outcome, cool = OutcomeOf(err)
		}
		var lost error
		if cause := context.Cause(wctx); errors.Is(cause, ErrLeaseLost) {
			lost = cause
		}
		rep := c.finish(ctx, l.LeaseRef, outcome, cool)
		switch {
		case errors.Is(rep, ErrLeaseLost):
			if lost == nil {
				lost = fmt.Errorf("client: report: %w", rep)
			}
		case rep != nil:
			rep = fmt.Errorf("%w: %w", ErrNotReported, rep)
		}
		if !panicked {
			err = errors.Join(err, lost, notLost(rep))
		}
	}()
	err = work(wctx, l)
	panicked = false
	return err
}

// notLost drops ErrLeaseLost, which Hold reports as the loss instead.
func notLost(err error) error {
	if errors.Is(err, ErrLeaseLost) {
		return nil
	}
	return err
}

// Pauses between the resends of Hold's report: doubling from the first to
// the last, ±50% jitter.
const (
	firstResend = 100 * time.Millisecond
	lastResend  = time.Second
)

// finish reports the outcome (or, for "", releases), even after ctx ended,
// sending it again within ReportTimeout while the answer says it may go
// through later. A report counts once per lease and a release is
// idempotent, so a resend is safe.
func (c *Client) finish(ctx context.Context, ref LeaseRef, o Outcome, cool time.Duration) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.ReportTimeout)
	defer cancel()
	pause, unknown := firstResend, false
	for {
		var err error
		if o == "" {
			err = c.Release(ctx, ref)
		} else {
			err = c.Report(ctx, ref, o, cool)
		}
		if unknown && errors.Is(err, ErrLeaseLost) && !errors.Is(err, ErrLeaseMismatch) {
			// An earlier send whose answer was lost most likely released it.
			return nil
		}
		if !resendable(err) {
			return err
		}
		// A store failure may hide a release that went through too.
		unknown = unknown || errors.Is(err, ErrUnreachable) || errors.Is(err, ErrTimeout) || errors.Is(err, ErrStoreUnavailable)
		t := time.NewTimer(pause/2 + rand.N(pause+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-t.C:
		}
		pause = min(2*pause, lastResend)
	}
}

// resendable reports whether a report or release that failed with err may
// go through if sent again.
func resendable(err error) bool {
	for _, target := range []error{ErrUnreachable, ErrTimeout, ErrStoreUnavailable, ErrCatalogUnavailable, ErrContended} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// lifetime is how long a lease granted to a request sent at sent lasts by
// this process's clock: the length asked for (the service's default if
// none), shortened if the service's answer says less (a lower
// --max-lease). A skewed clock can only make it shorter, never longer.
func lifetime(asked time.Duration, until, sent time.Time) time.Duration {
	d := defaultLease
	if asked > 0 {
		d = time.Duration(seconds(asked)) * time.Second
	}
	if left := until.Sub(sent); left > 0 && left < d {
		d = left
	}
	return d
}

// minRenewWait is the shortest wait before a renewal: a lease that a
// skewed clock makes look a few milliseconds long is not renewed in a hot
// loop (it is then given up when it would expire, on the safe side).
const minRenewWait = 200 * time.Millisecond

// renewIn is the wait before the next renewal: d jittered, but no later
// than a fifth of the lease (life) before it expires (left from now), so
// that the renewal's round trip fits, and never under minRenewWait.
func renewIn(d, left, life time.Duration) time.Duration {
	return max(min(jitter(d), left-life/5), minRenewWait)
}

// keep renews ref every fraction of life until ctx ends. It calls lose
// when a renewal says the lease is lost, or when expiry passes with no
// renewal through. Every renewal is bounded by the expiry, so keep never
// outlives the lease by more than a scheduling delay. The lease's length,
// and so the interval, is taken again from each renewal's answer.
func (c *Client) keep(ctx context.Context, lose context.CancelCauseFunc, ref LeaseRef, asked, life time.Duration, expiry time.Time) {
	every := time.Duration(float64(life) * c.opts.RenewFraction)
	next := time.NewTimer(renewIn(every, time.Until(expiry), life))
	defer next.Stop()
	dead := time.NewTimer(time.Until(expiry))
	defer dead.Stop()
	var last error
	for {
		select {
		case <-ctx.Done():
			return
		case <-dead.C:
			if last == nil {
				last = errors.New("no renewal answered")
			}
			lose(fmt.Errorf("%w: not renewed before it expired: %w", ErrLeaseLost, last))
			return
		case <-next.C:
		}
		rctx, cancel := context.WithDeadline(ctx, expiry)
		sent := time.Now()
		until, err := c.Renew(rctx, ref, asked)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			last = nil
			life = lifetime(asked, until, sent)
			every = time.Duration(float64(life) * c.opts.RenewFraction)
			expiry = sent.Add(life)
			dead.Reset(time.Until(expiry))
			next.Reset(renewIn(every, time.Until(expiry), life))
		case errors.Is(err, ErrLeaseLost):
			lose(fmt.Errorf("client: renew: %w", err))
			return
		default:
			// Unreachable or a 503: try again soon, until the expiry.
			last = err
			next.Reset(renewIn(every/4, time.Until(expiry), life))
		}
	}
}

// jitter spreads d by ±20%.
func jitter(d time.Duration) time.Duration {
	return d - d/5 + rand.N(2*d/5+1)
}
