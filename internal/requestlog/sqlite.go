package requestlog

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/credpool/credpool/internal/retry"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
)

// schema is the request log's table in the SQLite file, versioned in
// request_log_schema. Append steps; never edit a released one.
var schema = sqlitex.Schema{Table: "request_log_schema", Steps: [][]string{
	// One row per id; lease is the recorded lease as JSON (NULL while
	// claimed), lease_id its id for Extend. A row whose until has passed is
	// dead and pruned by later claims.
	{
		`CREATE TABLE request_log (
			id          TEXT PRIMARY KEY,
			token       TEXT NOT NULL,
			fingerprint TEXT NOT NULL,
			lease       TEXT,
			lease_id    TEXT,
			until       INTEGER NOT NULL
		)`,
		`CREATE INDEX request_log_lease_id ON request_log (lease_id)`,
		`CREATE INDEX request_log_until ON request_log (until)`,
	},
}}

// pruneBatch bounds the dead rows one Claim removes: the table shrinks as
// fast as it grows, and no claim pays for a backlog at once.
const pruneBatch = 64

// SQLite is the request log in a SQLite file (the lease store's). It is
// safe for concurrent use, across processes sharing the file too. Its
// clock is this host's.
type SQLite struct {
	db *sqlitex.DB
}

// NewSQLite returns the request log in db, creating or upgrading its table
// under ctx. Its writes queue on db's write gate, with those of the lease
// store and the catalog sharing db.
func NewSQLite(ctx context.Context, db *sqlitex.DB) (*SQLite, error) {
	if err := sqlitex.Migrate(ctx, db.DB, schema, retry.Policy{}); err != nil {
		return nil, sqlitex.Classify(ctx, "open", err)
	}
	return &SQLite{db: db}, nil
}

// Claim is Redis.Claim on the file; it also prunes a batch of dead rows.
func (s *SQLite) Claim(ctx context.Context, id, token, fingerprint string, ttl time.Duration) (Entry, bool, error) {
	var (
		e       Entry
		claimed bool
		verdict error
	)
	err := s.db.Write(ctx, retry.Policy{}, func(tx *sql.Tx, now int64) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM request_log WHERE id IN
			(SELECT id FROM request_log WHERE until <= ? LIMIT ?)`, now, pruneBatch); err != nil {
			return err
		}
		var (
			rec   record
			lease sql.NullString
		)
		// A dead row (not pruned yet) is no row: it is replaced.
		err := tx.QueryRowContext(ctx, `SELECT token, fingerprint, lease FROM request_log WHERE id = ? AND until > ?`, id, now).
			Scan(&rec.Token, &rec.Fingerprint, &lease)
		if errors.Is(err, sql.ErrNoRows) {
			claimed, verdict = true, nil
			_, err = tx.ExecContext(ctx, `INSERT INTO request_log (id, token, fingerprint, until) VALUES (?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET token = excluded.token, fingerprint = excluded.fingerprint,
				lease = NULL, lease_id = NULL, until = excluded.until`,
				id, token, fingerprint, now+max(ttl, claimFloor).Milliseconds())
			return err
		}
		if err != nil {
			return err
		}
		if lease.Valid {
			rec.Lease = &optimistic.Lease{}
			if err := json.Unmarshal([]byte(lease.String), rec.Lease); err != nil {
				return fmt.Errorf("request record %s: %w", id, err)
			}
		}
		e, claimed, verdict = judge(rec, token, fingerprint)
		return nil
	})
	if err != nil {
		return Entry{}, false, sqlitex.Classify(ctx, "claim request", err)
	}
	return e, claimed, verdict
}

// Record is Redis.Record on the file. A claim that expired is lost even
// while its dead row waits to be pruned, as it is in Redis.
func (s *SQLite) Record(ctx context.Context, id, token string, l optimistic.Lease) error {
	raw, err := json.Marshal(l)
	if err != nil {
		return err
	}
	var n int64
	err = s.db.Write(ctx, retry.Policy{}, func(tx *sql.Tx, now int64) error {
		res, err := tx.ExecContext(ctx, `UPDATE request_log SET lease = ?, lease_id = ?, until = ?
			WHERE id = ? AND token = ? AND until > ?`,
			string(raw), l.LeaseID, l.Until.UnixMilli(), id, token, now)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	switch {
	case err != nil:
		return sqlitex.Classify(ctx, "record request", err)
	case n == 0:
		return ErrClaimLost
	}
	return nil
}

// Forget is Redis.Forget on the file.
func (s *SQLite) Forget(ctx context.Context, id, token string) error {
	err := s.db.Write(ctx, retry.Policy{}, func(tx *sql.Tx, _ int64) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM request_log WHERE id = ? AND token = ?`, id, token)
		return err
	})
	return sqlitex.Classify(ctx, "forget request", err)
}

// Extend is Redis.Extend on the file. Most leases answered no request id:
// for those it only reads.
func (s *SQLite) Extend(ctx context.Context, leaseID string, until time.Time) error {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM request_log WHERE lease_id = ?`, leaseID).Scan(&n); err != nil || n == 0 {
		return sqlitex.Classify(ctx, "extend request", err)
	}
	err := s.db.Write(ctx, retry.Policy{}, func(tx *sql.Tx, _ int64) error {
		_, err := tx.ExecContext(ctx, `UPDATE request_log SET until = MAX(until, ?) WHERE lease_id = ?`, until.UnixMilli(), leaseID)
		return err
	})
	return sqlitex.Classify(ctx, "extend request", err)
}
