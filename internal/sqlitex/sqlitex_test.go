package sqlitex_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/retry"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/internal/sqlitex/sqlitextest"
	"github.com/credpool/credpool/optimistic"
)

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
	db := sqlitextest.Temp(t).DB
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
	db := sqlitextest.Temp(t).DB
	require.NoError(t, sqlitex.Migrate(t.Context(), db, v2, retry.Policy{}))
	err := sqlitex.Migrate(t.Context(), db, v1, retry.Policy{})
	require.ErrorContains(t, err, "newer than this binary")
}

// A failing step leaves the previous version, with nothing of the step.
func TestMigrateFailedStepChangesNothing(t *testing.T) {
	db := sqlitextest.Temp(t).DB
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
	db := sqlitextest.Temp(t).DB
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
	require.NoError(t, sqlitex.Migrate(t.Context(), sqlitextest.Open(t, path).DB, v1, retry.Policy{}))
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
	dbs := []*sql.DB{sqlitextest.Open(t, path).DB, sqlitextest.Open(t, path).DB, sqlitextest.Open(t, path).DB}
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

// A database whose lock another connection keeps is busy: Classify marks it
// as the contract's conflict, Migrate and Write retry it and then say so,
// and a ctx that ends keeps the busy cause next to its own.
func TestBusyIsConflict(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	holder := sqlitextest.Open(t, path)
	tx, err := holder.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(t.Context(), `CREATE TABLE locked (id TEXT)`)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()

	raw, err := sql.Open("sqlite", path+"?_txlock=immediate&_pragma=busy_timeout(5)")
	require.NoError(t, err)
	t.Cleanup(func() { _ = raw.Close() })
	db := sqlitex.Wrap(raw)
	p := retry.Policy{MaxRetries: 2}
	err = sqlitex.Migrate(t.Context(), db.DB, v1, p)
	require.True(t, sqlitex.Busy(err), "%v", err)
	require.ErrorIs(t, sqlitex.Classify(t.Context(), "migrate", err), optimistic.ErrConflict)
	require.ErrorIs(t, sqlitex.Classify(t.Context(), "migrate", err), optimistic.ErrContended)

	var tries []error
	p.OnTry = func(err error) { tries = append(tries, err) }
	ran := false
	err = db.Write(t.Context(), p, func(*sql.Tx, int64) error {
		ran = true
		return nil
	})
	require.ErrorIs(t, sqlitex.Classify(t.Context(), "write", err), optimistic.ErrContended)
	require.False(t, ran, "BEGIN IMMEDIATE found the file busy")
	require.Len(t, tries, 3)
	for _, err := range tries {
		require.True(t, sqlitex.Busy(err), "%v", err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	p = retry.Policy{MaxRetries: 1000, OnRetry: func(error, time.Duration) { cancel() }}
	err = sqlitex.Migrate(ctx, db.DB, v1, p)
	require.True(t, sqlitex.Busy(err), "the busy cause survives: %v", err)
	require.ErrorIs(t, err, context.Canceled)

	require.False(t, sqlitex.Busy(context.Canceled))
	require.NoError(t, sqlitex.Classify(t.Context(), "nothing", nil))
	require.ErrorIs(t, sqlitex.Classify(t.Context(), "broken", errors.New("disk I/O error")), optimistic.ErrStore)
}

// Write commits what fn did, or nothing when fn fails; Read sees it, and
// does not wait for a writer.
func TestWriteAndRead(t *testing.T) {
	db := sqlitextest.Temp(t)
	require.NoError(t, sqlitex.Migrate(t.Context(), db.DB, v1, retry.Policy{}))
	before := time.Now().UnixMilli()
	require.NoError(t, db.Write(t.Context(), retry.Policy{}, func(tx *sql.Tx, now int64) error {
		require.GreaterOrEqual(t, now, before)
		_, err := tx.ExecContext(t.Context(), `INSERT INTO demo (id) VALUES ('kept')`)
		return err
	}))
	failed := errors.New("fn failed")
	err := db.Write(t.Context(), retry.Policy{}, func(tx *sql.Tx, _ int64) error {
		if _, err := tx.ExecContext(t.Context(), `INSERT INTO demo (id) VALUES ('rolled back')`); err != nil {
			return err
		}
		return failed
	})
	require.ErrorIs(t, err, failed)

	release := holdGate(t, db)
	defer release()
	var ids []string
	require.NoError(t, db.Read(t.Context(), retry.Policy{}, func(tx *sql.Tx, _ int64) error {
		ids = nil
		rows, err := tx.QueryContext(t.Context(), `SELECT id FROM demo`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return rows.Err()
	}))
	require.Equal(t, []string{"kept"}, ids)
}

// Refused without quoting the path: a URL given for one carries its
// password there.
func TestOpenRejectsQueryInPath(t *testing.T) {
	_, err := sqlitex.Open(filepath.Join(t.TempDir(), "x.db?password=hunter2"))
	require.ErrorContains(t, err, "must not contain '?'")
	require.NotContains(t, err.Error(), "hunter2")
}

// The file holds credentials: only its owner may read it, and its WAL too.
func TestOpenCreatesPrivateFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	db := sqlitextest.Open(t, path)
	require.NoError(t, sqlitex.Migrate(t.Context(), db.DB, v1, retry.Policy{}))
	requireMode(t, 0o600, path, path+"-wal", path+"-shm")
}

// A file left open to others (an older build, a copy, a restore) is made
// private when opened, with its -wal and -shm.
func TestOpenMakesExistingFilesPrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	// The holder keeps the WAL and shared memory files in place.
	holder := sqlitextest.Open(t, path)
	require.NoError(t, sqlitex.Migrate(t.Context(), holder.DB, v1, retry.Policy{}))
	files := []string{path, path + "-wal", path + "-shm"}
	for i, mode := range []os.FileMode{0o644, 0o640, 0o606} {
		require.NoError(t, os.Chmod(files[i], mode))
	}
	sqlitextest.Open(t, path)
	requireMode(t, 0o600, files...)
}

func requireMode(t *testing.T, want os.FileMode, paths ...string) {
	t.Helper()
	for _, p := range paths {
		fi, err := os.Stat(p)
		require.NoError(t, err)
		require.Equal(t, want, fi.Mode().Perm(), p)
	}
}

// A burst of callers queues for connections instead of opening one each.
func TestOpenBoundsConnections(t *testing.T) {
	db := sqlitextest.Temp(t).DB
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
	require.Equal(t, sqlitex.MaxConns, st.OpenConnections, "the burst's connections stay open, idle, for the next one")
}
