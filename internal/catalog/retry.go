package catalog

import (
	"context"
	"database/sql"
	"errors"

	"github.com/credpool/credpool/internal/retry"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
)

// busyPolicy retries writes that came back busy, with retry's defaults (10
// pauses from 1ms, doubling to 64ms, within 2s). SQLite's busy handler is
// not fair: under a stream of writers from other processes, or the lease
// store sharing the file, one connection can wait out its whole
// busy_timeout, so such a write is tried again after a jittered pause.
var busyPolicy = retry.Policy{}

// inTx runs fn in one write transaction and commits if fn succeeds;
// otherwise it rolls back and nothing is written. A busy transaction runs
// again, so fn must have no effect outside tx but assigning its results. On
// SQLite fn's first statement should be a write: starting with a read and
// then writing can fail busy at once instead of waiting for the lock.
func (s *SQL) inTx(ctx context.Context, op string, fn func(*sql.Tx) error) error {
	return fail(ctx, op, s.write(ctx, func() error { return sqlitex.InTx(ctx, s.db, nil, fn) }))
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
	return retry.Do(ctx, busyPolicy, sqlitex.Busy, func() error {
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
// error mapping serves both: ErrNotFound passes through, and the rest go
// through optimistic.Classify with busy marked as a conflict (ErrInvalid
// passes, cancellation keeps both causes, still busy after the retries is
// optimistic.ErrContended, anything else optimistic.ErrStore).
func fail(ctx context.Context, op string, err error) error {
	if errors.Is(err, ErrNotFound) {
		return err
	}
	return optimistic.Classify(ctx, "catalog: "+op, sqlitex.Conflict(err))
}
