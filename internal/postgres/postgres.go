// Package postgres is what the catalog needs of PostgreSQL, as sqlitex is
// for SQLite: opening a database by URL through pgx, transactions run
// again when PostgreSQL aborted them for a lost race, telling a lost race
// from a broken database, and the migration runner.
package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/credpool/credpool/internal/retry"
)

// MaxConns bounds the connections one Open keeps. The hot path reads one
// prepared row per request; writes queue on the catalog's generation row
// anyway.
const MaxConns = 16

// DB is a PostgreSQL database opened by Open. It is safe for concurrent
// use.
type DB struct{ *sql.DB }

// IsURL reports whether s names a PostgreSQL database (postgres:// or
// postgresql://, in any case) rather than a SQLite file.
func IsURL(s string) bool {
	scheme, _, ok := strings.Cut(s, "://")
	return ok && (strings.EqualFold(scheme, "postgres") || strings.EqualFold(scheme, "postgresql"))
}

// keyword matches a libpq keyword/value connection string's setting.
var keyword = regexp.MustCompile(`(?i)(^|\s)(host|hostaddr|port|dbname|user|password|passfile|sslmode|service|connect_timeout)\s*=`)

// userinfo matches a URL's user:password@ at the start of a name that has
// no scheme.
var userinfo = regexp.MustCompile(`^[^/@\s]*:[^/@\s]*@`)

// CheckTarget refuses a database name that is neither a SQLite file path
// nor a PostgreSQL URL: a libpq keyword/value string (host=… password=…)
// or a URL without its scheme (user:password@host/db), which would
// otherwise be taken for a file name, or a URL of another scheme. Its
// errors never quote s: it may hold a password.
func CheckTarget(s string) error {
	switch {
	case IsURL(s):
		return nil
	case keyword.MatchString(s):
		return errors.New("looks like a libpq keyword/value connection string (host=… user=…): give PostgreSQL as a URL, postgres://user:password@host:port/database")
	case userinfo.MatchString(s):
		return errors.New("looks like a URL without its scheme (user:password@host…): give PostgreSQL as postgres://user:password@host:port/database")
	case strings.Contains(s, "://"):
		return errors.New("is a URL, but not a postgres:// or postgresql:// one: give a SQLite file path or a PostgreSQL URL")
	}
	return nil
}

// Open connects to the database at rawURL (postgres://user:password@host:port/db?sslmode=...,
// libpq's URL form; PG* environment variables fill in what it leaves out)
// and checks that it answers. Its errors never carry the password. The
// caller closes the returned db.
func Open(ctx context.Context, rawURL string) (*DB, error) {
	// pgx takes only a lower-case scheme for a URL.
	scheme, rest, _ := strings.Cut(rawURL, "://")
	cfg, err := pgx.ParseConfig(strings.ToLower(scheme) + "://" + rest)
	if err != nil {
		// pgx's message may quote the URL; Redact's does not keep the password.
		return nil, fmt.Errorf("postgres: %s: not a valid URL, want postgres://user:password@host:port/database", Redact(rawURL))
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(MaxConns)
	db.SetMaxIdleConns(MaxConns)
	db.SetConnMaxIdleTime(time.Minute)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("postgres: %s: %w", Redact(rawURL), err)
	}
	return &DB{db}, nil
}

// Redact is rawURL without its passwords (the user's, and the password
// and sslpassword parameters libpq also takes), for messages; a string
// that is no PostgreSQL URL (a SQLite path) is returned as it is.
func Redact(rawURL string) string {
	if !IsURL(rawURL) {
		return rawURL
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return "postgres://…"
	}
	q := u.Query()
	for _, p := range []string{"password", "sslpassword"} {
		if q.Has(p) {
			q.Set(p, "xxxxx")
		}
	}
	u.RawQuery = q.Encode()
	return u.Redacted()
}

// Write runs fn in one READ COMMITTED transaction and commits it if fn
// succeeds; otherwise it rolls back and nothing is written. A try that
// PostgreSQL aborted for a lost race (a deadlock, a serialization failure)
// runs again after a jittered pause, under p. It returns fn's or the
// database's error unclassified (see Classify).
func (db *DB) Write(ctx context.Context, p retry.Policy, fn func(*sql.Tx) error) error {
	return retry.Do(ctx, p, Conflict, func() error { return inTx(ctx, db.DB, nil, fn) })
}

// Read runs fn, which only reads, in one REPEATABLE READ, read-only
// transaction: every statement of fn sees the same snapshot.
func (db *DB) Read(ctx context.Context, p retry.Policy, fn func(*sql.Tx) error) error {
	opts := &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}
	return retry.Do(ctx, p, Conflict, func() error { return inTx(ctx, db.DB, opts, fn) })
}

// Conflict reports whether PostgreSQL aborted err's transaction because
// of a concurrent one (SQLSTATE class 40: serialization failure,
// deadlock): nothing was written and it is worth trying again.
func Conflict(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && strings.HasPrefix(pe.Code, "40")
}

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
