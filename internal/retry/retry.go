// Package retry is the one retry loop of credpool's lease stores and its
// catalog: bounded by a number of pauses and by elapsed time, jittered,
// ended early by ctx, and honest about why it stopped.
package retry

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Policy bounds one call's retries. It is a value: copy it, set OnRetry or
// OnTry for the call, and pass it to Do. A zero field takes its default.
type Policy struct {
	// MaxRetries bounds the pauses, so op runs at most MaxRetries+1 times.
	//
	// default: 10
	MaxRetries int

	// MinBackoff is the first pause; later pauses grow by 2x, each with
	// ±50% jitter so that callers who collided do not collide again.
	//
	// default: 1ms
	MinBackoff time.Duration

	// MaxBackoff caps the pause before its jitter: a pause is at most
	// 1.5x MaxBackoff.
	//
	// default: 64ms
	MaxBackoff time.Duration

	// MaxElapsed bounds the time from the first try to the last pause; it is
	// checked before each pause, so a try already running finishes.
	//
	// default: 2s
	MaxElapsed time.Duration

	// OnRetry, if set, is called before each pause with the error that
	// caused it: the place to count conflicts.
	OnRetry func(err error, pause time.Duration)

	// OnTry, if set, is called after each try with its error, nil for a
	// success: the place to count tries, including one that ctx cut short.
	OnTry func(err error)
}

func (p Policy) withDefaults() Policy {
	if p.MaxRetries <= 0 {
		p.MaxRetries = 10
	}
	if p.MinBackoff <= 0 {
		p.MinBackoff = time.Millisecond
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = 64 * time.Millisecond
	}
	if p.MaxElapsed <= 0 {
		p.MaxElapsed = 2 * time.Second
	}
	return p
}

// Do runs op until it returns nil or an error for which again returns
// false, pausing between tries. It returns nil, op's last error (a
// permanent one, or a retryable one once the budget is spent), or, when
// ctx ends the call (during a pause or during a try), ctx's error joined
// with op's last error and its last retryable one, so the caller sees both
// why it was retrying and why it stopped. A ctx that has ended before the first
// try still lets op run once: op decides what a dead ctx means.
//
// The backoff is built per call: backoff.ExponentialBackOff must not be
// shared between goroutines.
func Do(ctx context.Context, p Policy, again func(error) bool, op func() error) error {
	p = p.withDefaults()
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(p.MinBackoff),
		backoff.WithMaxInterval(p.MaxBackoff),
		backoff.WithMaxElapsedTime(p.MaxElapsed),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0.5),
	)
	var last, cause error // op's last error, and its last retryable one
	err := backoff.RetryNotify(func() error {
		last = op()
		if p.OnTry != nil {
			p.OnTry(last)
		}
		if last == nil || again(last) {
			if last != nil {
				cause = last
			}
			return last
		}
		return backoff.Permanent(last)
	}, backoff.WithContext(backoff.WithMaxRetries(b, uint64(p.MaxRetries)), ctx), p.OnRetry)
	// When ctx ended the call (backoff then returns ctx.Err() alone, or op
	// its own ctx error), keep why it was retrying as well.
	if err != nil && ctx.Err() != nil {
		for _, e := range []error{last, cause} {
			if e != nil && !errors.Is(err, e) {
				err = errors.Join(e, err)
			}
		}
	}
	return err
}
