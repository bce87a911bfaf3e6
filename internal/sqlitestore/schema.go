package sqlitestore

import "github.com/credpool/credpool/internal/sqlitex"

// schema is the store's tables, versioned in lease_schema. Append new
// steps; never edit a released one. Tables are prefixed lease_ because the
// file is shared with the key catalog.
var schema = sqlitex.Schema{Table: "lease_schema", Steps: [][]string{
	// lease_keys is a key's allocation state. cooldown_until and
	// max_concurrent_uses are read back as text through optimistic.Usable and
	// optimistic.ParseLimit, so a malformed value left by a buggy sync counts
	// exactly as it does in Redis. fence is the last fencing token handed out;
	// it lives and dies with the row.
	//
	// lease_leases holds one row per lease; until is its expiry in ms. A row
	// whose until has passed is expired, whether or not it is pruned yet.
	{`
CREATE TABLE IF NOT EXISTS lease_keys (
	id                  TEXT PRIMARY KEY,
	provider            TEXT NOT NULL,
	pool                TEXT NOT NULL,
	status              TEXT NOT NULL,
	cooldown_until      INTEGER,
	max_concurrent_uses INTEGER,
	last_used_at        INTEGER,
	score               REAL NOT NULL DEFAULT 0,
	fence               INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS lease_leases (
	id       TEXT PRIMARY KEY,
	key_id   TEXT NOT NULL REFERENCES lease_keys (id),
	provider TEXT NOT NULL,
	pool     TEXT NOT NULL,
	until    INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS lease_leases_key_until ON lease_leases (key_id, until);
`},
	// lease_requests maps an allocate request id to the lease that answered
	// it (JSON; NULL while the first request is in flight). A row whose until
	// has passed is dead.
	{`
CREATE TABLE IF NOT EXISTS lease_requests (
	id    TEXT PRIMARY KEY,
	lease TEXT,
	until INTEGER NOT NULL
);
`},
	// The request log moved to its own table (internal/requestlog); what
	// was in flight here only lived for a lease's length anyway.
	{`DROP TABLE IF EXISTS lease_requests`},
	// lease_probe is the one row that Nodes rewrites to show the file
	// takes writes (a full disk, a read-only file do not).
	{`
CREATE TABLE IF NOT EXISTS lease_probe (
	id INTEGER PRIMARY KEY CHECK (id = 1),
	at INTEGER NOT NULL
);
`},
	// lease_meta holds facts about the store itself, by name: "store_id"
	// names it in the catalog's records of synced keys (see EnsureID).
	{`
CREATE TABLE IF NOT EXISTS lease_meta (
	name  TEXT PRIMARY KEY,
	value TEXT NOT NULL
);
`},
}}
