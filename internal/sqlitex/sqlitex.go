// Package sqlitex is what the key catalog and the SQLite lease store share
// about SQLite: opening the file the way both rely on, telling a busy
// database from a broken one, and one migration runner for both schemas.
package sqlitex

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/credpool/credpool/optimistic"
)

// BusyTimeoutMillis is how long SQLite's busy handler waits for a lock
// before a statement fails busy and the caller's retry policy takes over.
const BusyTimeoutMillis = 1000

// MaxConns bounds the connections (and so the file descriptors) one Open
// keeps. SQLite has one writer at a time anyway, and WAL readers are
// cheap; a burst of callers queues for a connection, bounded by its ctx,
// instead of opening one each.
const MaxConns = 16

// Open opens the SQLite file at path, creating it if needed, with what the
// catalog and the lease store rely on: WAL mode (readers never wait for the
// writer), a busy timeout, foreign keys, and transactions that begin
// IMMEDIATE, so a write transaction takes the write lock up front instead
// of failing busy when it upgrades from a read. synchronous stays FULL,
// SQLite's default: a grant is on disk before Allocate returns it, so no
// fencing token is handed out twice, even across a power loss. A new file
// is created readable by its owner only (0600; SQLite gives its -wal and
// -shm files the same mode): it holds the credentials; secure_delete zeroes
// what a delete or an update frees, so an old secret does not linger in
// free pages. At most MaxConns
// connections stay open. The caller closes the returned db.
func Open(path string) (*sql.DB, error) {
	// The driver splits its parameters off at the first '?'.
	if strings.Contains(path, "?") {
		return nil, fmt.Errorf("sqlite: path %q must not contain '?'", path)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	q := url.Values{
		"_txlock": {"immediate"},
		"_pragma": {fmt.Sprintf("busy_timeout(%d)", BusyTimeoutMillis), "foreign_keys(1)", "journal_mode(WAL)", "secure_delete(1)"},
	}
	db, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(MaxConns)
	db.SetMaxIdleConns(MaxConns)
	db.SetConnMaxIdleTime(time.Minute)
	// sql.Open connects lazily; fail here on a bad path or file.
	if err := db.Ping(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	return db, nil
}

// Busy reports whether SQLite refused err's statement because another
// connection held a lock: nothing was written and it is worth retrying.
func Busy(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	// Extended result codes carry the primary code in the low byte.
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return true
	}
	return false
}

// Conflict marks a busy or locked error as optimistic.ErrConflict, SQLite's
// kind of lost race, so that optimistic.Classify reports one that outlived
// the retries as optimistic.ErrContended. Other errors pass unchanged.
func Conflict(err error) error {
	if Busy(err) {
		return fmt.Errorf("%w: %w", optimistic.ErrConflict, err)
	}
	return err
}

// InTx runs fn in one transaction on db and commits it if fn succeeds;
// otherwise it rolls back and nothing is written. It makes one attempt:
// callers retry a busy one under their own policy, so fn must have no
// effect outside tx but assigning its results.
func InTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		// Rollback's error adds nothing: nothing was committed either way.
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}
