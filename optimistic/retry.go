package optimistic

import (
	"context"
	"errors"
	"fmt"

	"github.com/cenkalti/backoff/v4"
	"github.com/redis/go-redis/v9"
)

// errRecheck asks for one more round after a commit whose reply was lost:
// the next read tells whether it landed.
var errRecheck = errors.New("optimistic: commit outcome unknown")

// retry runs op until it returns nil or a permanent error. Aborted commits
// (redis.TxFailedErr) and errRecheck are retried after a jittered,
// exponentially growing pause; the budget is MaxRetries pauses and
// MaxElapsed, and ctx ends it early. The policy is built per call because
// an ExponentialBackOff must not be shared.
func (s *Store) retry(ctx context.Context, op func() error) error {
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(s.opts.MinBackoff),
		backoff.WithMaxInterval(s.opts.MaxBackoff),
		backoff.WithMaxElapsedTime(s.opts.MaxElapsed),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0.5),
	)
	policy := backoff.WithContext(backoff.WithMaxRetries(b, uint64(s.opts.MaxRetries)), ctx)
	var last error
	err := backoff.Retry(func() error {
		last = op()
		if last == nil || errors.Is(last, redis.TxFailedErr) || errors.Is(last, errRecheck) {
			return last
		}
		return backoff.Permanent(last)
	}, policy)
	// backoff returns ctx.Err() alone when ctx ends during a pause; keep
	// what the last round ran into as well.
	if err != nil && last != nil && !errors.Is(err, last) {
		return errors.Join(last, err)
	}
	return err
}

// Classify turns what a store operation returned into the contract's
// errors: the contract's own results pass through, cancellation keeps both
// causes (and is not ErrStore), a conflict that outlived the retry budget is
// ErrContended, and anything else is wrapped as ErrStore. Every LeaseStore
// implementation uses it so their errors agree.
func Classify(ctx context.Context, op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNoCapacity), errors.Is(err, ErrLeaseLost), errors.Is(err, ErrInvalid):
		return err
	case ctx.Err() != nil:
		if errors.Is(err, ctx.Err()) {
			return fmt.Errorf("optimistic: %s: %w", op, err)
		}
		return errors.Join(fmt.Errorf("optimistic: %s: %w", op, err), ctx.Err())
	case errors.Is(err, redis.TxFailedErr):
		return fmt.Errorf("%w: %s", ErrContended, op)
	default:
		return StoreError(op, err)
	}
}
