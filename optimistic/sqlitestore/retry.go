package sqlitestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/credpool/credpool/optimistic"
)

// retry runs op until it returns nil or an error that is not busy. Busy
// errors are retried after a jittered, exponentially growing pause; the
// budget is MaxBusyRetries retries and MaxElapsed, and ctx ends it early.
// st counts transactions tried and busy retries. The policy is built per
// call because an ExponentialBackOff must not be shared.
func (s *Store) retry(ctx context.Context, st *optimistic.Stats, op func() error) error {
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(s.opts.MinBackoff),
		backoff.WithMaxInterval(s.opts.MaxBackoff),
		backoff.WithMaxElapsedTime(s.opts.MaxElapsed),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0.5),
	)
	policy := backoff.WithContext(backoff.WithMaxRetries(b, uint64(s.opts.MaxBusyRetries)), ctx)
	return backoff.RetryNotify(func() error {
		st.Attempts++
		err := op()
		if err == nil || Busy(err) {
			return err
		}
		return backoff.Permanent(err)
	}, policy, func(error, time.Duration) { st.Conflicts++ })
}

// Busy reports whether SQLite refused err's statement because another
// connection held a lock: nothing was written, it is worth retrying, and it
// is never a store failure. The key catalog, in the same file, uses it too.
func Busy(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	// Extended result codes carry the primary code in the low byte.
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return true
	}
	return false
}

// classify is optimistic.Classify, plus the one mapping it cannot know:
// SQLite still busy after the retry budget is ErrContended.
func classify(ctx context.Context, op string, err error) error {
	if Busy(err) && ctx.Err() == nil {
		return fmt.Errorf("%w: %s: %w", optimistic.ErrContended, op, err)
	}
	return optimistic.Classify(ctx, op, err)
}
