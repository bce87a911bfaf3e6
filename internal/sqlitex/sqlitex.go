// Package sqlitex is what the key catalog, the SQLite lease store and the
// request log share about SQLite: opening the file the way they rely on,
// one write gate for all of them, telling a busy database from a broken
// one, and one migration runner for their schemas.
package sqlitex

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/credpool/credpool/internal/retry"
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

// DB is a SQLite database and the one write gate that every writer on it
// shares: the catalog, the lease store and the request log, handed the same
// DB, queue their write transactions here, in arrival order, instead of in
// SQLite's busy handler, which polls a taken lock with sleeps of up to
// 100ms and can starve one writer. The busy handler is left to arbitrate
// between processes. DB is safe for concurrent use.
type DB struct {
	*sql.DB
	// gate holds a token while a write transaction of this DB runs.
	gate chan struct{}
}

// TxFunc is the body of one transaction; now is this host's clock in ms,
// read after BEGIN. It may run again after a busy rollback, so it must have
// no effect outside tx but assigning its results.
type TxFunc func(tx *sql.Tx, now int64) error

// Open opens the SQLite file at path, creating it if needed, with what the
// catalog and the lease store rely on: WAL mode (readers never wait for the
// writer), a busy timeout, foreign keys, and transactions that begin
// IMMEDIATE, so a write transaction takes the write lock up front instead
// of failing busy when it upgrades from a read. synchronous stays FULL,
// SQLite's default: a grant is on disk before Allocate returns it, so no
// fencing token is handed out twice, even across a power loss. The file
// holds the credentials, so it is readable by its owner only: a new file is
// created 0600 (SQLite gives its -wal and -shm files the same mode), and
// group and other access is taken away from an existing one and its -wal
// and -shm. secure_delete zeroes what a delete or an update frees, so an
// old secret does not linger in free pages. At most MaxConns connections
// stay open. The caller closes the returned db.
func Open(path string) (*DB, error) {
	// The driver splits its parameters off at the first '?'.
	if strings.Contains(path, "?") {
		// Not quoted: a URL given for a path carries its password there.
		return nil, errors.New("sqlite: the path must not contain '?'")
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	if err := private(path); err != nil {
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
	return Wrap(db), nil
}

// private takes group and other access away from the database file and the
// -wal and -shm files beside it, as an older build or another tool may
// have left them. Owner bits stay: a read-only file stays read-only.
func private(path string) error {
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if perm := fi.Mode().Perm(); perm&0o077 != 0 {
			if err := os.Chmod(p, perm&^0o077); err != nil {
				return err
			}
		}
	}
	return nil
}

// Wrap gives db, opened otherwise than by Open (another DSN), a write gate.
// Wrap a handle once and share the result: each DB has a gate of its own.
func Wrap(db *sql.DB) *DB {
	return &DB{DB: db, gate: make(chan struct{}, 1)}
}

// Write runs fn in one write transaction and commits it if fn succeeds;
// otherwise it rolls back and nothing is written. Each try first waits for
// the DB's gate, until ctx ends. A try that found the file busy or locked
// is rolled back and, after a jittered pause (the gate given back, so one
// busy episode does not stall every other writer), tried again under p.
// It returns fn's or the database's error unclassified (see Classify).
func (db *DB) Write(ctx context.Context, p retry.Policy, fn TxFunc) error {
	return retry.Do(ctx, p, Busy, func() error {
		select {
		case db.gate <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		defer func() { <-db.gate }()
		return inTx(ctx, db.DB, nil, clocked(fn))
	})
}

// Read runs fn, which only reads, in one transaction that begins deferred
// (sql.TxOptions.ReadOnly), so it takes no write lock, retrying a busy one
// under p. It does not wait for the gate: in WAL mode readers never wait
// for the writer.
func (db *DB) Read(ctx context.Context, p retry.Policy, fn TxFunc) error {
	return retry.Do(ctx, p, Busy, func() error {
		return inTx(ctx, db.DB, &sql.TxOptions{ReadOnly: true}, clocked(fn))
	})
}

// clocked reads the clock once BEGIN has run: under the write lock, the
// clock agrees with the order in which transactions commit.
func clocked(fn TxFunc) func(*sql.Tx) error {
	return func(tx *sql.Tx) error { return fn(tx, time.Now().UnixMilli()) }
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

// Classify is optimistic.Classify for a SQLite error, so that one error
// mapping serves the SQLite and the Redis stores: busy or locked is first
// marked optimistic.ErrConflict, SQLite's kind of lost race, so one that
// outlived the retries is optimistic.ErrContended, never a store failure.
// nil stays nil.
func Classify(ctx context.Context, op string, err error) error {
	if Busy(err) {
		err = fmt.Errorf("%w: %w", optimistic.ErrConflict, err)
	}
	return optimistic.Classify(ctx, op, err)
}

// inTx runs fn in one transaction on db and commits it if fn succeeds;
// otherwise it rolls back and nothing is written. It makes one attempt.
func inTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
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
