package catalog

import (
	"context"
	"database/sql"
	"slices"
	"strconv"
	"strings"

	"github.com/credpool/credpool/internal/postgres"
	"github.com/credpool/credpool/internal/sqlitex"
)

// engine is the catalog's database: SQLite (internal/sqlitex, the embedded
// default) or PostgreSQL (internal/postgres). What differs between the two
// is here. The SQL elsewhere is written once, with ? placeholders, which
// the engine's methods and txn rewrite to PostgreSQL's $1, $2, ...
type engine struct {
	db       *sql.DB
	postgres bool
	// write runs fn in one write transaction: on SQLite queued on the
	// database's write gate and retried when busy, on PostgreSQL retried
	// when it lost a race (see the two packages).
	write func(ctx context.Context, fn func(*sql.Tx) error) error
	// read runs fn in one read-only transaction that sees one snapshot.
	read func(ctx context.Context, fn func(*sql.Tx) error) error
}

func sqliteEngine(db *sqlitex.DB) *engine {
	return &engine{
		db: db.DB,
		write: func(ctx context.Context, fn func(*sql.Tx) error) error {
			return db.Write(ctx, busyPolicy, func(tx *sql.Tx, _ int64) error { return fn(tx) })
		},
		read: func(ctx context.Context, fn func(*sql.Tx) error) error {
			return db.Read(ctx, busyPolicy, func(tx *sql.Tx, _ int64) error { return fn(tx) })
		},
	}
}

func postgresEngine(db *postgres.DB) *engine {
	return &engine{
		db:       db.DB,
		postgres: true,
		write:    func(ctx context.Context, fn func(*sql.Tx) error) error { return db.Write(ctx, busyPolicy, fn) },
		read:     func(ctx context.Context, fn func(*sql.Tx) error) error { return db.Read(ctx, busyPolicy, fn) },
	}
}

func (e *engine) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return e.db.ExecContext(ctx, bind(e.postgres, q), args...)
}

func (e *engine) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return e.db.QueryContext(ctx, bind(e.postgres, q), args...)
}

func (e *engine) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return e.db.QueryRowContext(ctx, bind(e.postgres, q), args...)
}

func (e *engine) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	return e.db.PrepareContext(ctx, bind(e.postgres, q))
}

// txn is a transaction on an engine; its statements take ? placeholders.
type txn struct {
	*sql.Tx
	postgres bool
}

func (t txn) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return t.Tx.ExecContext(ctx, bind(t.postgres, q), args...)
}

func (t txn) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return t.Tx.QueryContext(ctx, bind(t.postgres, q), args...)
}

func (t txn) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return t.Tx.QueryRowContext(ctx, bind(t.postgres, q), args...)
}

func (t txn) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	return t.Tx.PrepareContext(ctx, bind(t.postgres, q))
}

// writeTx and readTx are write and read with fn given a txn.
func (e *engine) writeTx(ctx context.Context, fn func(txn) error) error {
	return e.write(ctx, func(tx *sql.Tx) error { return fn(txn{tx, e.postgres}) })
}

func (e *engine) readTx(ctx context.Context, fn func(txn) error) error {
	return e.read(ctx, func(tx *sql.Tx) error { return fn(txn{tx, e.postgres}) })
}

// bind rewrites q's ? placeholders to $1, $2, ... for PostgreSQL. The
// catalog's SQL has no ? anywhere else (no string literal holds one).
func bind(postgres bool, q string) string {
	if !postgres || !strings.Contains(q, "?") {
		return q
	}
	var b strings.Builder
	b.Grow(len(q) + 16)
	n := 0
	for _, part := range strings.SplitAfter(q, "?") {
		if p, ok := strings.CutSuffix(part, "?"); ok {
			n++
			b.WriteString(p)
			b.WriteString("$" + strconv.Itoa(n))
		} else {
			b.WriteString(part)
		}
	}
	return b.String()
}

// Spelled differently by the two engines: migration step 5's random
// stamp.
const (
	sqliteRandomStamp   = `lower(hex(randomblob(16)))`
	postgresRandomStamp = `md5(random()::text || clock_timestamp()::text)`
)

// postgresSteps is schema's steps as PostgreSQL runs them: the same
// tables and types (see schema); only the random stamp is spelled
// PostgreSQL's way.
func postgresSteps() [][]string {
	steps := make([][]string, len(schema.Steps))
	for i, step := range schema.Steps {
		steps[i] = slices.Clone(step)
		for j, stmt := range step {
			steps[i][j] = strings.ReplaceAll(stmt, sqliteRandomStamp, postgresRandomStamp)
		}
	}
	return steps
}
