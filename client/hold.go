package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// ErrNotReported wraps the error of Hold's final report: the outcome was
// not recorded (the lease then expires by itself). The work itself may
// have succeeded.
var ErrNotReported = errors.New("client: outcome not reported")

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
// error, or an *UpstreamError, for an upstream's 429 or 401/403. The
// report is sent even after ctx is done, within Options.ReportTimeout.
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
		if !panicked {
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

// finish reports the outcome (or, for "", releases), even after ctx ended.
func (c *Client) finish(ctx context.Context, ref LeaseRef, o Outcome, cool time.Duration) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.ReportTimeout)
	defer cancel()
	if o == "" {
		return c.Release(ctx, ref)
	}
	return c.Report(ctx, ref, o, cool)
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

// keep renews ref every fraction of life until ctx ends. It calls lose
// when a renewal says the lease is lost, or when expiry passes with no
// renewal through. Every renewal is bounded by the expiry, so keep never
// outlives the lease by more than a scheduling delay.
func (c *Client) keep(ctx context.Context, lose context.CancelCauseFunc, ref LeaseRef, asked, life time.Duration, expiry time.Time) {
	every := time.Duration(float64(life) * c.opts.RenewFraction)
	next := time.NewTimer(jitter(every))
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
			expiry = sent.Add(lifetime(asked, until, sent))
			dead.Reset(time.Until(expiry))
			next.Reset(jitter(every))
		case errors.Is(err, ErrLeaseLost):
			lose(fmt.Errorf("client: renew: %w", err))
			return
		default:
			// Unreachable or a 503: try again soon, until the expiry.
			last = err
			next.Reset(jitter(every / 4))
		}
	}
}

// jitter spreads d by ±20%.
func jitter(d time.Duration) time.Duration {
	return d - d/5 + rand.N(2*d/5+1)
}
