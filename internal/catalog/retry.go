package catalog

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/credpool/credpool/internal/postgres"
	"github.com/credpool/credpool/internal/retry"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
)

// busyPolicy retries writes that came back busy, with retry's defaults (10
// pauses from 1ms, doubling to 64ms, within 2s). SQLite's busy handler is
// not fair: under a stream of writers from other processes one connection
// can wait out its whole busy_timeout, so such a write is tried again after
// a jittered pause.
var busyPolicy = retry.Policy{}

// history is how many generations catalog_generations and the tombstones
// remember (a Cache further behind reloads everything), pruned every
// pruneEvery-th generation.
type history struct{ keep, pruneEvery int64 }

var defaultHistory = history{keep: 10_000, pruneEvery: 256}

// errUnchanged ends a write transaction that found nothing to change: it
// rolls back, so the generation does not move, and write returns nil.
var errUnchanged = errors.New("catalog: nothing to change")

// write runs fn in one write transaction, queued on the database's write
// gate with the lease store and the request log, and commits if fn
// succeeds; otherwise it rolls back and nothing is written (fn returns
// errUnchanged when it found nothing to do). The transaction first takes
// the next generation, gen, with a random stamp (a write, so SQLite takes
// its lock up front and PostgreSQL orders the writers on that row), and fn
// stamps every key row it changes with it (gen = ?): that is how a Cache,
// in this process or another, learns what changed. A busy transaction runs
// again, so fn must have no effect outside tx but assigning its results.
func (s *SQL) write(ctx context.Context, op string, fn func(tx txn, gen int64) error) error {
	err := s.db.writeTx(ctx, func(tx txn) error {
		stamp := rand.Text()
		var gen int64
		if err := tx.QueryRowContext(ctx, `UPDATE catalog_generation SET gen = gen + 1, stamp = ? WHERE id = 1 RETURNING gen`,
			stamp).Scan(&gen); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO catalog_generations (gen, stamp) VALUES (?, ?)`, gen, stamp); err != nil {
			return err
		}
		if gen%s.history.pruneEvery == 0 {
			for _, table := range []string{"catalog_generations", "catalog_tombstones"} {
				if _, err := tx.ExecContext(ctx, `DELETE FROM `+table+` WHERE gen <= ?`, gen-s.history.keep); err != nil {
					return err
				}
			}
		}
		return fn(tx, gen)
	})
	// Counted even if the commit's reply was lost: List then checks.
	s.writes.Add(1)
	if errors.Is(err, errUnchanged) {
		return nil
	}
	return fail(ctx, op, err)
}

// fail classifies a database error the way the lease stores do, so one
// error mapping serves both: ErrNotFound, ErrAliasNotFound, ErrWrongKey,
// optimistic.ErrInvalid and ErrContended pass through, cancellation keeps
// both causes, a lost race that outlived the retries (SQLite's busy,
// PostgreSQL's serialization failure) is optimistic.ErrContended, and
// anything else optimistic.ErrStore. Its text names the catalog, not a
// lease store: the log of a failed request says which part failed.
func fail(ctx context.Context, op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrAliasNotFound), errors.Is(err, ErrWrongKey),
		errors.Is(err, optimistic.ErrInvalid), errors.Is(err, optimistic.ErrContended):
		return err
	case ctx.Err() != nil:
		if errors.Is(err, ctx.Err()) {
			return fmt.Errorf("catalog: %s: %w", op, err)
		}
		return errors.Join(fmt.Errorf("catalog: %s: %w", op, err), ctx.Err())
	case errors.Is(err, optimistic.ErrConflict), sqlitex.Busy(err), postgres.Conflict(err):
		return &dbError{op: op, err: err, contended: true}
	}
	return &dbError{op: op, err: err}
}

// dbError is a failure of the catalog's database. It matches
// optimistic.ErrStore, or ErrContended if contended, as a lease store's
// failure would, and its cause; unlike theirs, its text names the catalog.
type dbError struct {
	op        string
	err       error
	contended bool
}

func (e *dbError) Error() string {
	if e.contended {
		return fmt.Sprintf("catalog: %s: gave up after repeated conflicts: %v", e.op, e.err)
	}
	return fmt.Sprintf("catalog: %s: %v", e.op, e.err)
}

func (e *dbError) Unwrap() []error {
	if e.contended {
		return []error{optimistic.ErrContended, e.err}
	}
	return []error{optimistic.ErrStore, e.err}
}
