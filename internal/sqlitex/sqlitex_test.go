package sqlitex_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/retry"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
)

func open(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sqlitex.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

var v1 = sqlitex.Schema{Table: "demo_schema", Steps: [][]string{
	{`CREATE TABLE demo (id TEXT PRIMARY KEY)`},
}}

// v2 is v1 with one step appended, as a later build ships it.
var v2 = sqlitex.Schema{Table: v1.Table, Steps: append(append([][]string(nil), v1.Steps...),
	[]string{`ALTER TABLE demo ADD COLUMN note TEXT`, `CREATE INDEX demo_note ON demo (note)`})}

func versions(t *testing.T, db *sql.DB, table string) []int {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), `SELECT version FROM "`+table+`" ORDER BY version`)
	require.NoError(t, err)
	defer rows.Close()
	var out []int
	for rows.Next() {
		var v int
		require.NoError(t, rows.Scan(&v))
		out = append(out, v)
	}
	require.NoError(t, rows.Err())
	return out
}

func TestMigrateUpgradesInOrder(t *testing.T) {
	db := open(t, filepath.Join(t.TempDir(), "x.db"))
	require.NoError(t, sqlitex.Migrate(t.Context(), db, v1, retry.Policy{}))
	require.NoError(t, sqlitex.Migrate(t.Context(), db, v1, retry.Policy{}), "idempotent")
	require.Equal(t, []int{1}, versions(t, db, v1.Table))

	require.NoError(t, sqlitex.Migrate(t.Context(), db, v2, retry.Policy{}))
	require.Equal(t, []int{1, 2}, versions(t, db, v1.Table))
	_, err := db.ExecContext(t.Context(), `INSERT INTO demo (id, note) VALUES ('a', 'b')`)
	require.NoError(t, err)
}

// A file from a newer build is refused, not downgraded or half-read.
func TestMigrateRefusesNewerSchema(t *testing.T) {
	db := open(t, filepath.Join(t.TempDir(), "x.db"))
	require.NoError(t, sqlitex.Migrate(t.Context(), db, v2, retry.Policy{}))
	err := sqlitex.Migrate(t.Context(), db, v1, retry.Policy{})
	require.ErrorContains(t, err, "newer than this binary")
}

// A failing step leaves the previous version, with nothing of the step.
func TestMigrateFailedStepChangesNothing(t *testing.T) {
	db := open(t, filepath.Join(t.TempDir(), "x.db"))
	require.NoError(t, sqlitex.Migrate(t.Context(), db, v1, retry.Policy{}))
	bad := sqlitex.Schema{Table: v1.Table, Steps: append(append([][]string(nil), v1.Steps...),
		[]string{`CREATE TABLE half (id TEXT)`, `THIS IS NOT SQL`})}
	require.Error(t, sqlitex.Migrate(t.Context(), db, bad, retry.Policy{}))
	require.Equal(t, []int{1}, versions(t, db, v1.Table))
	var n int
	require.NoError(t, db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM sqlite_schema WHERE name = 'half'`).Scan(&n))
	require.Zero(t, n)
}

// The lease store's version table used to have no applied_at column; a
// file written then upgrades in place.
func TestMigrateOldVersionTable(t *testing.T) {
	db := open(t, filepath.Join(t.TempDir(), "x.db"))
	for _, stmt := range []string{
		`CREATE TABLE demo_schema (version INTEGER NOT NULL)`,
		`CREATE TABLE demo (id TEXT PRIMARY KEY)`,
		`INSERT INTO demo_schema (version) VALUES (1)`,
	} {
		_, err := db.ExecContext(t.Context(), stmt)
		require.NoError(t, err)
	}
	require.NoError(t, sqlitex.Migrate(t.Context(), db, v1, retry.Policy{}), "current: nothing to do")
	require.NoError(t, sqlitex.Migrate(t.Context(), db, v2, retry.Policy{}))
	require.Equal(t, []int{1, 2}, versions(t, db, v1.Table))
}

// A current schema is only read, so a read-only file opens.
func TestMigrateReadOnlyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	require.NoError(t, sqlitex.Migrate(t.Context(), open(t, path), v1, retry.Policy{}))
	// mode=ro rather than chmod: tests may run as root, which ignores modes.
	ro, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ro.Close() })
	require.NoError(t, sqlitex.Migrate(t.Context(), ro, v1, retry.Policy{}))
	require.Error(t, sqlitex.Migrate(t.Context(), ro, v2, retry.Policy{}), "an upgrade needs to write")
}

// Processes starting at once, each with its own *sql.DB on the file, apply
// every step exactly once.
func TestMigrateConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	dbs := []*sql.DB{open(t, path), open(t, path), open(t, path)}
	const starts = 12
	errs := make(chan error, starts)
	for i := range starts {
		go func() { errs <- sqlitex.Migrate(t.Context(), dbs[i%len(dbs)], v2, retry.Policy{}) }()
	}
	for range starts {
		require.NoError(t, <-errs)
	}
	require.Equal(t, []int{1, 2}, versions(t, dbs[0], v2.Table))
}

// A database whose lock another connection keeps is busy: Conflict marks it
// as the contract's conflict, Migrate retries it and then says so, and a
// ctx that ends keeps the busy cause next to its own.
func TestBusyIsConflict(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	holder := open(t, path)
	tx, err := holder.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(t.Context(), `CREATE TABLE locked (id TEXT)`)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()

	db, err := sql.Open("sqlite", path+"?_txlock=immediate&_pragma=busy_timeout(5)")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	p := retry.Policy{MaxRetries: 2}
	err = sqlitex.Migrate(t.Context(), db, v1, p)
	require.True(t, sqlitex.Busy(err), "%v", err)
	require.ErrorIs(t, sqlitex.Conflict(err), optimistic.ErrConflict)
	require.ErrorIs(t, optimistic.Classify(t.Context(), "migrate", sqlitex.Conflict(err)), optimistic.ErrContended)

	ctx, cancel := context.WithCancel(t.Context())
	p.MaxRetries = 1000
	p.OnRetry = func(error, time.Duration) { cancel() }
	err = sqlitex.Migrate(ctx, db, v1, p)
	require.True(t, sqlitex.Busy(err), "the busy cause survives: %v", err)
	require.ErrorIs(t, err, context.Canceled)

	require.False(t, sqlitex.Busy(context.Canceled))
	require.NoError(t, sqlitex.Conflict(nil))
}

func TestOpenRejectsQueryInPath(t *testing.T) {
	_, err := sqlitex.Open(filepath.Join(t.TempDir(), "x.db?mode=ro"))
	require.ErrorContains(t, err, "must not contain '?'")
}

// The file holds credentials: only its owner may read it, and its WAL too.
func TestOpenCreatesPrivateFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	db := open(t, path)
	require.NoError(t, sqlitex.Migrate(t.Context(), db, v1, retry.Policy{}))
	for _, p := range []string{path, path + "-wal"} {
		fi, err := os.Stat(p)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), p)
	}
}

// A burst of callers queues for connections instead of opening one each.
func TestOpenBoundsConnections(t *testing.T) {
	db := open(t, filepath.Join(t.TempDir(), "x.db"))
	require.NoError(t, sqlitex.Migrate(t.Context(), db, v1, retry.Policy{}))
	const callers = 200
	start := make(chan struct{})
	errs := make(chan error, callers)
	for range callers {
		go func() {
			<-start
			rows, err := db.QueryContext(t.Context(), `SELECT id FROM demo`)
			if err == nil {
				// Hold the connection a moment, as a slow reader would.
				time.Sleep(time.Millisecond)
				err = rows.Close()
			}
			errs <- err
		}()
	}
	close(start)
	for range callers {
		require.NoError(t, <-errs)
	}
	st := db.Stats()
	require.Equal(t, sqlitex.MaxConns, st.MaxOpenConnections)
	require.Positive(t, st.WaitCount, "the burst queued for connections")
	require.LessOrEqual(t, st.OpenConnections, sqlitex.MaxConns)
}
