package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/credpool/credpool/internal/retry"
)

// Migrate brings the tables whose versions table records to version
// len(steps), as sqlitex.Migrate does on SQLite; steps[i] brings them from
// version i to i+1. The missing steps and their version rows commit in one
// transaction (PostgreSQL's DDL is transactional), so on failure the
// schema stays at its previous version. That transaction first takes an
// advisory lock named after table, so processes starting at once migrate
// one after the other. A schema already current is only read.
func Migrate(ctx context.Context, db *DB, table string, steps [][]string, p retry.Policy) error {
	v, err := version(ctx, db.DB, table)
	if err == nil && v < len(steps) {
		err = db.Write(ctx, p, func(tx *sql.Tx) error { return upgrade(ctx, tx, table, steps) })
	} else if err == nil && v > len(steps) {
		err = newer(v, len(steps))
	}
	if err != nil {
		return fmt.Errorf("migrate %s: %w", table, err)
	}
	return nil
}

func newer(v, known int) error {
	return fmt.Errorf("schema version %d is newer than this binary knows (%d)", v, known)
}

// version reads the highest applied version, 0 for a new database.
func version(ctx context.Context, db *sql.DB, table string) (int, error) {
	var exists bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, quote(table)).Scan(&exists); err != nil || !exists {
		return 0, err
	}
	var v int
	err := db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM `+quote(table)).Scan(&v)
	return v, err
}

func upgrade(ctx context.Context, tx *sql.Tx, table string, steps [][]string) error {
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, table); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+quote(table)+` (
		version    INTEGER PRIMARY KEY,
		applied_at BIGINT
	)`); err != nil {
		return err
	}
	var v int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM `+quote(table)).Scan(&v); err != nil {
		return err
	}
	if v > len(steps) {
		return newer(v, len(steps))
	}
	now := time.Now().UnixMilli()
	for ; v < len(steps); v++ {
		for _, stmt := range steps[v] {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("version %d: %w", v+1, err)
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+quote(table)+` (version, applied_at) VALUES ($1, $2)`, v+1, now); err != nil {
			return fmt.Errorf("version %d: %w", v+1, err)
		}
	}
	return nil
}

// quote makes a table name an identifier; names here are the catalog's
// own constants.
func quote(table string) string { return `"` + table + `"` }
