package catalog

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// migrations are applied in order; migrations[i] brings the schema to
// version i+1. Append only: a released step is never edited.
//
// Types are chosen to mean the same on SQLite and PostgreSQL: BIGINT holds
// unix milliseconds (NULL = unset), TEXT the ids. The foreign key documents
// the relation; SQLite enforces it only with PRAGMA foreign_keys=ON, so
// Delete removes model rows itself.
var migrations = [][]string{
	{
		`CREATE TABLE catalog_keys (
			id                  TEXT PRIMARY KEY,
			provider            TEXT NOT NULL,
			pool                TEXT NOT NULL,
			secret              TEXT NOT NULL,
			status              TEXT NOT NULL,
			cooldown_until      BIGINT,
			max_concurrent_uses INTEGER NOT NULL,
			last_used_at        BIGINT,
			last_verified_at    BIGINT,
			successes           BIGINT NOT NULL DEFAULT 0,
			errors              BIGINT NOT NULL DEFAULT 0,
			rate_limit_hits     BIGINT NOT NULL DEFAULT 0,
			created_at          BIGINT NOT NULL,
			updated_at          BIGINT NOT NULL
		)`,
		`CREATE INDEX catalog_keys_provider_pool ON catalog_keys (provider, pool, id)`,
		`CREATE TABLE catalog_key_models (
			key_id TEXT NOT NULL REFERENCES catalog_keys (id) ON DELETE CASCADE,
			model  TEXT NOT NULL,
			PRIMARY KEY (key_id, model)
		)`,
		`CREATE TABLE catalog_model_aliases (
			provider TEXT NOT NULL,
			alias    TEXT NOT NULL,
			model    TEXT NOT NULL,
			PRIMARY KEY (provider, alias)
		)`,
	},
}

// lockSchema is the first statement of the migration transaction. On SQLite
// any write takes the database write lock at once, waiting up to
// busy_timeout, so a second process blocks here and then sees the new
// version; starting with a read would instead fail with SQLITE_BUSY when
// the transaction later upgrades to a write. SQLite-specific: PostgreSQL
// would use LOCK TABLE catalog_schema IN EXCLUSIVE MODE.
const lockSchema = `DELETE FROM catalog_schema WHERE version < 0`

// migrate brings the schema to the latest version. It is idempotent and
// safe when several processes start at once: the steps and their version
// rows commit together, so on failure the schema is left at its previous
// version.
func (s *SQL) migrate(ctx context.Context) error {
	// Outside the transaction: a concurrent creator makes this a no-op once
	// it holds the lock, and the transaction below can then start with a write.
	if _, err := s.exec(ctx, `CREATE TABLE IF NOT EXISTS catalog_schema (
		version    INTEGER PRIMARY KEY,
		applied_at BIGINT NOT NULL
	)`); err != nil {
		return fail(ctx, "create schema table", err)
	}
	return s.inTx(ctx, "migrate", func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, lockSchema); err != nil {
			return err
		}
		var version int
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM catalog_schema`).Scan(&version); err != nil {
			return err
		}
		if version > len(migrations) {
			return fmt.Errorf("schema version %d is newer than this binary knows (%d)", version, len(migrations))
		}
		now := time.Now().UnixMilli()
		for i := version; i < len(migrations); i++ {
			for _, stmt := range migrations[i] {
				if _, err := tx.ExecContext(ctx, stmt); err != nil {
					return fmt.Errorf("version %d: %w", i+1, err)
				}
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO catalog_schema (version, applied_at) VALUES (?, ?)`, i+1, now); err != nil {
				return fmt.Errorf("version %d: %w", i+1, err)
			}
		}
		return nil
	})
}
