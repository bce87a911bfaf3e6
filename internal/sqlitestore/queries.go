package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
)

// query names one statement of the hot path (Allocate, Release, Renew,
// Holds, Inspect) or of a sync (SyncKeys, which a bulk put runs per key).
// New prepares each once: compiling a statement costs SQLite about twice
// what running it does.
type query int

const (
	// qReadKeys reads the keys whose ids are in a JSON array (?1), in its
	// order, one row per element, each with its leases live at ?2 (ms). A
	// missing key's row has NULL key columns. One statement whatever the
	// number of keys, so Inspect costs one query.
	qReadKeys query = iota
	qPrune
	qInsertLease
	qGrantKey
	qHolds
	qDeleteLease
	qRenewLease
	qUpsertKey
	nQueries
)

var queryText = [nQueries]string{
	qReadKeys: `
SELECT k.id IS NOT NULL, k.provider, k.pool, k.status, k.cooldown_until, k.max_concurrent_uses,
       k.fence, k.last_used_at, count(l.id), coalesce(min(l.until), 0)
FROM json_each(?1) c
LEFT JOIN lease_keys k ON k.id = c.value
LEFT JOIN lease_leases l ON l.key_id = k.id AND l.until > ?2
GROUP BY c.key
ORDER BY c.key`,
	qPrune:       `DELETE FROM lease_leases WHERE key_id = ? AND until <= ?`,
	qInsertLease: `INSERT INTO lease_leases (id, key_id, provider, pool, until) VALUES (?, ?, ?, ?, ?)`,
	qGrantKey:    `UPDATE lease_keys SET status = ?, cooldown_until = NULL, last_used_at = ?, fence = ? WHERE id = ?`,
	qHolds:       `SELECT provider, pool, until FROM lease_leases WHERE id = ? AND key_id = ?`,
	qDeleteLease: `DELETE FROM lease_leases WHERE id = ?`,
	qRenewLease:  `UPDATE lease_leases SET until = ? WHERE id = ?`,
	qUpsertKey: `
INSERT INTO lease_keys (id, provider, pool, status, cooldown_until, max_concurrent_uses, last_used_at, score)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET
	provider = excluded.provider,
	pool = excluded.pool,
	status = excluded.status,
	cooldown_until = excluded.cooldown_until,
	max_concurrent_uses = excluded.max_concurrent_uses,
	last_used_at = coalesce(lease_keys.last_used_at, excluded.last_used_at),
	score = excluded.score`,
}

// statements are the prepared queries, indexed by query.
type statements [nQueries]*sql.Stmt

// prepare compiles every query on db; on error it closes what it made.
func prepare(ctx context.Context, db *sql.DB) (statements, error) {
	var st statements
	for q, text := range queryText {
		stmt, err := db.PrepareContext(ctx, text)
		if err != nil {
			return statements{}, errors.Join(err, st.close())
		}
		st[q] = stmt
	}
	return st, nil
}

// close closes every prepared statement.
func (st *statements) close() error {
	var errs []error
	for _, stmt := range st {
		if stmt != nil {
			errs = append(errs, stmt.Close())
		}
	}
	return errors.Join(errs...)
}

// on returns statement q bound to tx. database/sql keeps it prepared on
// each connection that ran it, so only a connection's first use compiles.
func (s *Store) on(ctx context.Context, tx *sql.Tx, q query) *sql.Stmt {
	return tx.StmtContext(ctx, s.stmts[q])
}
