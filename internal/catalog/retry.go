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

// nextGen takes the catalog's next generation: the first statement of
// every write transaction, so SQLite takes its write lock up front and
// PostgreSQL orders the writers on this row.
const nextGen = `UPDATE catalog_generation SET gen = gen + 1 WHERE id = 1 RETURNING gen`

// write runs fn in one write transaction, queued on the database's write
// gate with the lease store and the request log, and commits if fn
// succeeds; otherwise it rolls back and nothing is written. The
// transaction first takes the next generation, gen, and fn stamps every
// key row it changes with it (gen = ?): that is how a Cache, in this
// process or another, learns what changed. A busy transaction runs again,
// so fn must have no effect outside tx but assigning its results.
func (s *SQL) write(ctx context.Context, op string, fn func(tx *sql.Tx, gen int64) error) error {
	err := s.db.Write(ctx, busyPolicy, func(tx *sql.Tx, _ int64) error {
		var gen int64
		if err := tx.QueryRowContext(ctx, nextGen).Scan(&gen); err != nil {
			return err
		}
		return fn(tx, gen)
	})
	if err != nil {
		return fail(ctx, op, err)
	}
	s.writes.Add(1)
	return nil
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
