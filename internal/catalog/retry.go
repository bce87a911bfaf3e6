package catalog

import (
	"context"
	"database/sql"
	"errors"

	"github.com/credpool/credpool/internal/retry"
	"github.com/credpool/credpool/internal/sqlitex"
)

// busyPolicy retries writes that came back busy, with retry's defaults (10
// pauses from 1ms, doubling to 64ms, within 2s). SQLite's busy handler is
// not fair: under a stream of writers from other processes one connection
// can wait out its whole busy_timeout, so such a write is tried again after
// a jittered pause.
var busyPolicy = retry.Policy{}

// inTx runs fn in one write transaction, queued on the database's write
// gate with the lease store and the request log, and commits if fn
// succeeds; otherwise it rolls back and nothing is written. A busy
// transaction runs again, so fn must have no effect outside tx but
// assigning its results. On SQLite fn's first statement should be a write:
// starting with a read and then writing can fail busy at once instead of
// waiting for the lock.
func (s *SQL) inTx(ctx context.Context, op string, fn func(*sql.Tx) error) error {
	return fail(ctx, op, s.db.Write(ctx, busyPolicy, func(tx *sql.Tx, _ int64) error { return fn(tx) }))
}

// exec runs one write statement as a transaction of its own.
func (s *SQL) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	var res sql.Result
	err := s.db.Write(ctx, busyPolicy, func(tx *sql.Tx, _ int64) error {
		var err error
		res, err = tx.ExecContext(ctx, query, args...)
		return err
	})
	return res, err
}

// fail classifies a database error the way the lease stores do, so one
// error mapping serves both: ErrNotFound passes through, and the rest go
// through sqlitex.Classify (ErrInvalid passes, cancellation keeps both
// causes, still busy after the retries is optimistic.ErrContended, anything
// else optimistic.ErrStore).
func fail(ctx context.Context, op string, err error) error {
	if errors.Is(err, ErrNotFound) {
		return err
	}
	return sqlitex.Classify(ctx, "catalog: "+op, err)
}
