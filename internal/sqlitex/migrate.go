package sqlitex

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/credpool/credpool/internal/retry"
)

// Schema is one set of tables that migrates as a unit. Steps[i] brings it
// from version i to i+1; append new steps, never edit a released one.
type Schema struct {
	// Table records the applied versions, one row each.
	Table string
	Steps [][]string
}

// Migrate brings s to its latest version. It is idempotent and safe when
// several processes start at once: each step commits together with its
// version row, so on failure the schema is left at its previous version.
// A schema already current is only read, so a read-only file opens. A
// busy database is retried under p; ctx ends the wait.
func Migrate(ctx context.Context, db *sql.DB, s Schema, p retry.Policy) error {
	err := retry.Do(ctx, p, Busy, func() error {
		v, err := version(ctx, db, s.Table)
		if err != nil || v >= len(s.Steps) {
			return newer(s, v, err)
		}
		return upgrade(ctx, db, s)
	})
	if err != nil {
		return fmt.Errorf("migrate %s: %w", s.Table, err)
	}
	return nil
}

func newer(s Schema, v int, err error) error {
	if err == nil && v > len(s.Steps) {
		return fmt.Errorf("schema version %d is newer than this binary knows (%d)", v, len(s.Steps))
	}
	return err
}

// version reads the highest applied version, 0 for a new file.
func version(ctx context.Context, db *sql.DB, table string) (int, error) {
	var n int
	err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM sqlite_schema WHERE type = 'table' AND name = ?`, table).Scan(&n)
	if err != nil || n == 0 {
		return 0, err
	}
	err = db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM "`+table+`"`).Scan(&n)
	return n, err
}

// upgrade applies the missing steps in one transaction that starts with a
// write: SQLite then takes its write lock at once, waiting up to
// busy_timeout, so a second process blocks here and then sees the new
// version. Starting with a read would instead fail busy when the
// transaction later upgrades to a write.
func upgrade(ctx context.Context, db *sql.DB, s Schema) error {
	// Outside the transaction: a concurrent creator makes this a no-op once
	// it holds the lock.
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS "`+s.Table+`" (
		version    INTEGER PRIMARY KEY,
		applied_at BIGINT
	)`); err != nil {
		return err
	}
	return inTx(ctx, db, nil, func(tx *sql.Tx) error { return apply(ctx, tx, s) })
}

func apply(ctx context.Context, tx *sql.Tx, s Schema) error {
	if _, err := tx.ExecContext(ctx, `DELETE FROM "`+s.Table+`" WHERE version < 0`); err != nil {
		return err
	}
	if err := addAppliedAt(ctx, tx, s.Table); err != nil {
		return err
	}
	var v int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM "`+s.Table+`"`).Scan(&v); err != nil {
		return err
	}
	if err := newer(s, v, nil); err != nil {
		return err
	}
	now := time.Now().UnixMilli()
	for ; v < len(s.Steps); v++ {
		for _, stmt := range s.Steps[v] {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("version %d: %w", v+1, err)
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO "`+s.Table+`" (version, applied_at) VALUES (?, ?)`, v+1, now); err != nil {
			return fmt.Errorf("version %d: %w", v+1, err)
		}
	}
	return nil
}

// addAppliedAt gives a version table written by an older build, which kept
// only the version, its applied_at column. The caller holds the write lock.
func addAppliedAt(ctx context.Context, tx *sql.Tx, table string) error {
	var n int
	err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = 'applied_at'`, table).Scan(&n)
	if err != nil || n > 0 {
		return err
	}
	_, err = tx.ExecContext(ctx, `ALTER TABLE "`+table+`" ADD COLUMN applied_at BIGINT`)
	return err
}
