package catalog

import (
	"context"
	"database/sql"
	"errors"
	"maps"
	"slices"
	"time"
)

// changes is what the catalog holds beyond a generation a Cache has seen.
type changes struct {
	gen   int64
	stamp string
	// all says keys is every key: the cache drops what it had.
	all bool
	// keys changed (or all of them), secrets as stored (sealed); gone were
	// deleted.
	keys []Key
	gone []string
	// aliases is every alias, by provider and alias; nil if nothing moved.
	aliases map[alias]string
}

type alias struct{ provider, name string }

// changesSince reads what changed after generation since, stamped stamp:
// the keys stamped later and the tombstones of those deleted later; or
// every key when since is 0, no longer logged, or logged with another
// stamp (the catalog was restored from a backup). It is one read
// transaction, so one consistent view on both engines (PostgreSQL's
// REPEATABLE READ).
func (s *SQL) changesSince(ctx context.Context, since int64, stamp string) (changes, error) {
	var c changes
	err := s.db.readTx(ctx, func(tx txn) error {
		c = changes{}
		if err := tx.QueryRowContext(ctx, `SELECT gen, stamp FROM catalog_generation WHERE id = 1`).Scan(&c.gen, &c.stamp); err != nil {
			return err
		}
		if c.gen == since && c.stamp == stamp {
			return nil
		}
		var logged string
		err := tx.QueryRowContext(ctx, `SELECT stamp FROM catalog_generations WHERE gen = ?`, since).Scan(&logged)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		c.all = since == 0 || logged != stamp
		if c.all {
			c.keys, err = queryKeys(ctx, tx, true, "")
		} else {
			c.keys, err = queryKeys(ctx, tx, true, `WHERE k.gen > ?`, since)
			if err == nil {
				c.gone, err = tombstones(ctx, tx, since)
			}
		}
		if err != nil {
			return err
		}
		c.aliases, err = aliases(ctx, tx)
		return err
	})
	if err != nil {
		return changes{}, fail(ctx, "read changes", err)
	}
	return c, nil
}

func tombstones(ctx context.Context, tx txn, since int64) ([]string, error) {
	rows, err := tx.QueryContext(ctx, `SELECT key_id FROM catalog_tombstones WHERE gen > ?`, since)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

func aliases(ctx context.Context, tx txn) (map[alias]string, error) {
	rows, err := tx.QueryContext(ctx, `SELECT provider, alias, model FROM catalog_model_aliases`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[alias]string)
	for rows.Next() {
		var (
			a     alias
			model string
		)
		if err := rows.Scan(&a.provider, &a.name, &model); err != nil {
			return nil, err
		}
		out[a] = model
	}
	return out, rows.Err()
}

// use is what a Cache has to write behind for one key: counts of reports
// and the latest grant.
type use struct {
	successes, errors int64
	lastUsed          time.Time
}

// record writes a Cache's sums in one transaction; last_used_at only moves
// later, and keys deleted meanwhile are skipped. It takes no generation:
// counters and last use only rank keys, and Caches read them on their own
// schedule (CacheOptions.CountersEvery).
func (s *SQL) record(ctx context.Context, uses map[string]use) error {
	return s.db.writeTx(ctx, func(tx txn) error {
		update, err := tx.PrepareContext(ctx, `UPDATE catalog_keys SET
			successes = successes + ?, errors = errors + ?,
			last_used_at = CASE WHEN ? > COALESCE(last_used_at, 0) THEN ? ELSE last_used_at END
		WHERE id = ?`)
		if err != nil {
			return err
		}
		defer update.Close()
		// In id order: on PostgreSQL two instances flushing the same keys
		// then lock their rows in the same order, and never deadlock.
		for _, id := range slices.Sorted(maps.Keys(uses)) {
			u := uses[id]
			var last int64
			if !u.lastUsed.IsZero() {
				last = u.lastUsed.UnixMilli()
			}
			if _, err := update.ExecContext(ctx, u.successes, u.errors, last, last, id); err != nil {
				return err
			}
		}
		return nil
	})
}

// counters is the part of a key written behind.
type counters struct {
	successes, errors, rateLimitHits int64
	lastUsed                         time.Time
}

// readCounters reads every key's counters and last use.
func (s *SQL) readCounters(ctx context.Context) (map[string]counters, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, successes, errors, rate_limit_hits, last_used_at FROM catalog_keys`)
	if err != nil {
		return nil, fail(ctx, "read counters", err)
	}
	defer rows.Close()
	out := make(map[string]counters)
	for rows.Next() {
		var (
			id   string
			c    counters
			used sql.NullInt64
		)
		if err := rows.Scan(&id, &c.successes, &c.errors, &c.rateLimitHits, &used); err != nil {
			return nil, fail(ctx, "read counters", err)
		}
		c.lastUsed = fromMillis(used)
		out[id] = c
	}
	if err := rows.Err(); err != nil {
		return nil, fail(ctx, "read counters", err)
	}
	return out, nil
}
