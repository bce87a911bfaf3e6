package catalog

import (
	"context"
	"crypto/rand"
	"errors"

	"github.com/credpool/credpool/internal/postgres"
	"github.com/credpool/credpool/internal/retry"
	"github.com/credpool/credpool/internal/sqlitex"
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
// error mapping serves both: ErrNotFound, ErrAliasNotFound and
// ErrWrongKey pass through, and the rest go through sqlitex.Classify or
// postgres.Classify (ErrInvalid passes, cancellation keeps both causes, a
// lost race that outlived the retries, SQLite's busy or PostgreSQL's
// serialization failure, is optimistic.ErrContended, anything else
// optimistic.ErrStore).
func fail(ctx context.Context, op string, err error) error {
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrAliasNotFound) || errors.Is(err, ErrWrongKey) {
		return err
	}
	if postgres.Conflict(err) {
		return postgres.Classify(ctx, "catalog: "+op, err)
	}
	return sqlitex.Classify(ctx, "catalog: "+op, err)
}
