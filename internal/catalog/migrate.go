package catalog

import "github.com/credpool/credpool/internal/sqlitex"

// schema is the catalog's tables, versioned in catalog_schema; Steps[i]
// brings them to version i+1. Append only: a released step is never edited.
//
// Types are chosen to mean the same on SQLite and PostgreSQL: BIGINT holds
// unix milliseconds (NULL = unset), TEXT the ids. The foreign key documents
// the relation; SQLite enforces it only with PRAGMA foreign_keys=ON, so
// Delete removes model rows itself.
var schema = sqlitex.Schema{Table: "catalog_schema", Steps: [][]string{
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
	// catalog_reports remembers the leases Report counted, for
	// ReportMemory, so that a repeated report counts once.
	{
		`CREATE TABLE catalog_reports (
			lease_id    TEXT PRIMARY KEY,
			key_id      TEXT NOT NULL,
			outcome     TEXT NOT NULL,
			reported_at BIGINT NOT NULL
		)`,
		`CREATE INDEX catalog_reports_reported_at ON catalog_reports (reported_at)`,
	},
	// synced_at: when the key first reached the lease store (MarkSynced).
	{`ALTER TABLE catalog_keys ADD COLUMN synced_at BIGINT`},
	// synced_store: which lease store synced_at is about; quarantine_until:
	// no grants before it, after the store lost the key (Quarantine). Put
	// leaves both alone.
	{
		`ALTER TABLE catalog_keys ADD COLUMN synced_store TEXT`,
		`ALTER TABLE catalog_keys ADD COLUMN quarantine_until BIGINT`,
	},
	// The generation (see Cache): every write transaction that changes
	// keys or aliases takes the next one, with a random stamp, first; it
	// stamps the key rows it changes with it, and a deleted key leaves a
	// tombstone. catalog_generations logs recent generations' stamps, so
	// a reader holding generation g (and its stamp) knows whether the rows
	// and tombstones above g are all it missed: a generation that repeats
	// with another stamp (a restored backup written to since) or is no
	// longer logged means reading everything.
	{
		`CREATE TABLE catalog_generation (
			id    INTEGER PRIMARY KEY,
			gen   BIGINT NOT NULL,
			stamp TEXT NOT NULL
		)`,
		`INSERT INTO catalog_generation (id, gen, stamp) VALUES (1, 1, lower(hex(randomblob(16))))`,
		`CREATE TABLE catalog_generations (
			gen   BIGINT PRIMARY KEY,
			stamp TEXT NOT NULL
		)`,
		`INSERT INTO catalog_generations (gen, stamp) SELECT gen, stamp FROM catalog_generation`,
		`ALTER TABLE catalog_keys ADD COLUMN gen BIGINT NOT NULL DEFAULT 1`,
		`CREATE INDEX catalog_keys_gen ON catalog_keys (gen)`,
		`CREATE TABLE catalog_tombstones (
			key_id TEXT NOT NULL,
			gen    BIGINT NOT NULL
		)`,
		`CREATE INDEX catalog_tombstones_gen ON catalog_tombstones (gen)`,
	},
}}
