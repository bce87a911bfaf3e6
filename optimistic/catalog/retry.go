package catalog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/optimistic/sqlitestore"
)

// Busy retries, as in sqlitestore. SQLite's busy handler is not fair: under
// a stream of writers from other processes, or the lease store sharing the
// file, one connection can wait out its whole busy_timeout, so a write that
// comes back busy is tried again after a jittered pause.
const (
	maxBusyRetries = 10
	minBackoff     = time.Millisecond
	maxBackoff     = 64 * time.Millisecond
	maxElapsed     = 2 * time.Second
)

// retry runs op until it returns nil or an error other than busy, within
// the budget above and ctx. It returns op's last error. The policy is built
// per call because an ExponentialBackOff must not be shared.
func retry(ctx context.Context, op func() error) error {
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(minBackoff),
		backoff.WithMaxInterval(maxBackoff),
		backoff.WithMaxElapsedTime(maxElapsed),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0.5),
	)
	var last error
	// backoff would return ctx.Err() alone when ctx ends; last keeps the
	// cause, and fail joins the two.
	_ = backoff.Retry(func() error {
		last = op()
		if last == nil || sqlitestore.Busy(last) {
			return last
		}
		return backoff.Permanent(last)
	}, backoff.WithContext(backoff.WithMaxRetries(b, maxBusyRetries), ctx))
	return last
}

// inTx runs fn in one write transaction and commits if fn succeeds;
// otherwise it rolls back and nothing is written. A busy transaction runs
// again, so fn must have no effect outside tx but assigning its results. On
// SQLite fn's first statement should be a write: starting with a read and
// then writing can fail busy at once instead of waiting for the lock.
func (s *SQL) inTx(ctx context.Context, op string, fn func(*sql.Tx) error) error {
	return fail(ctx, op, s.write(ctx, func() error {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := fn(tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}))
}

// exec runs one write statement outside a transaction.
func (s *SQL) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	var res sql.Result
	err := s.write(ctx, func() error {
		var err error
		res, err = s.db.ExecContext(ctx, query, args...)
		return err
	})
	return res, err
}

// write runs op holding the catalog's write token, retrying while busy.
// SQLite has one writer at a time anyway; queueing our own writers on a
// channel is fair, where its busy handler polls and can starve one. The
// token is given back during a retry's pause, so one busy episode does not
// stall every other write of the process.
func (s *SQL) write(ctx context.Context, op func() error) error {
	return retry(ctx, func() error {
		select {
		case s.writing <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		defer func() { <-s.writing }()
		return op()
	})
}

// fail classifies a database error the way the lease stores do, so one
// error mapping serves both: ErrNotFound and ErrInvalid pass through,
// cancellation keeps both causes, still busy after the retries is
// optimistic.ErrContended, anything else optimistic.ErrStore.
func fail(ctx context.Context, op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNotFound), errors.Is(err, optimistic.ErrInvalid):
		return err
	case sqlitestore.Busy(err) && ctx.Err() == nil:
		return fmt.Errorf("%w: catalog: %s: %w", optimistic.ErrContended, op, err)
	}
	return optimistic.Classify(ctx, "catalog: "+op, err)
}
