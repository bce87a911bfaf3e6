package catalog

import (
	"context"
	"database/sql"
	"maps"
	"slices"
	"time"
)

// changes is what the catalog holds beyond a generation a Cache has seen.
type changes struct {
	gen int64
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

// changesSince reads, in one read transaction (one consistent view), what
// changed after generation since: the keys stamped later and the
// tombstones of those deleted later, or every key when since is 0, older
// than the tombstones kept, or newer than the catalog (restored from a
// backup).
func (s *SQL) changesSince(ctx context.Context, since int64) (changes, error) {
	var c changes
	err := s.db.Read(ctx, busyPolicy, func(tx *sql.Tx, _ int64) error {
		c = changes{}
		var pruned int64
		if err := tx.QueryRowContext(ctx, `SELECT gen, pruned FROM catalog_generation WHERE id = 1`).Scan(&c.gen, &pruned); err != nil {
			return err
		}
		if c.gen == since {
			return nil
		}
		c.all = since == 0 || since < pruned || c.gen < since
		var err error
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

func tombstones(ctx context.Context, tx *sql.Tx, since int64) ([]string, error) {
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

func aliases(ctx context.Context, tx *sql.Tx) (map[alias]string, error) {
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

// use is what a Cache has to write behind for one key: reports counted
// since the last flush, and the latest grant.
type use struct {
	successes, errors int64
	lastUsed          time.Time
}

// report is one success or error report waiting to be written, by lease.
type report struct {
	keyID   string
	outcome Outcome
	at      time.Time
}

// record writes a Cache's batch in one transaction: each report counts
// once per lease, as Report's do (a lease already reported, here or by
// Report, counts nothing), and last_used_at only moves later. Keys deleted
// meanwhile are skipped.
func (s *SQL) record(ctx context.Context, reports map[string]report, used map[string]time.Time) error {
	return s.write(ctx, "record uses", func(tx *sql.Tx, gen int64) error {
		byKey := make(map[string]*use)
		get := func(id string) *use {
			u := byKey[id]
			if u == nil {
				u = &use{}
				byKey[id] = u
			}
			return u
		}
		insert, err := tx.PrepareContext(ctx, `INSERT INTO catalog_reports (lease_id, key_id, outcome, reported_at)
		VALUES (?, ?, ?, ?) ON CONFLICT (lease_id) DO NOTHING`)
		if err != nil {
			return err
		}
		defer insert.Close()
		var newest time.Time
		for leaseID, r := range reports {
			res, err := insert.ExecContext(ctx, leaseID, r.keyID, string(r.outcome), r.at.UnixMilli())
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n == 0 {
				if err != nil {
					return err
				}
				continue
			}
			if r.outcome == OutcomeSuccess {
				get(r.keyID).successes++
			} else {
				get(r.keyID).errors++
			}
			if r.at.After(newest) {
				newest = r.at
			}
		}
		if len(reports) > 0 {
			if _, err := tx.ExecContext(ctx, `DELETE FROM catalog_reports WHERE reported_at < ?`,
				newest.Add(-ReportMemory).UnixMilli()); err != nil {
				return err
			}
		}
		for id, at := range used {
			get(id).lastUsed = at
		}
		update, err := tx.PrepareContext(ctx, `UPDATE catalog_keys SET
			successes = successes + ?, errors = errors + ?,
			last_used_at = CASE WHEN ? > COALESCE(last_used_at, 0) THEN ? ELSE last_used_at END,
			gen = ?
		WHERE id = ?`)
		if err != nil {
			return err
		}
		defer update.Close()
		// In id order, so concurrent writers lock rows in one order.
		for _, id := range slices.Sorted(maps.Keys(byKey)) {
			u := byKey[id]
			last := u.lastUsed.UnixMilli()
			if u.lastUsed.IsZero() {
				last = 0
			}
			if _, err := update.ExecContext(ctx, u.successes, u.errors, last, last, gen, id); err != nil {
				return err
			}
		}
		return nil
	})
}
