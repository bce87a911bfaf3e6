package test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/retry"
	"github.com/credpool/credpool/internal/sqlitestore"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/optimistic/leasetest"
)

// openSQLite opens a SQLite file with sqlitex.Open, closed when t ends.
func openSQLite(t *testing.T, path string) *sqlitex.DB {
	t.Helper()
	db, err := sqlitex.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// newSQLiteStore opens a store on db, closed when t ends (before db).
func newSQLiteStore(t *testing.T, db *sqlitex.DB, opts *sqlitestore.Options) *sqlitestore.Store {
	t.Helper()
	s, err := sqlitestore.New(context.Background(), db, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// sqliteBackend is a store on a fresh file; each peer opens the file
// again, as another process would.
func sqliteBackend(t *testing.T) leasetest.Backend { return sqliteBackendWith(t, nil) }

// sqliteBackendWith is sqliteBackend with the stores' options.
func sqliteBackendWith(t *testing.T, opts *sqlitestore.Options) leasetest.Backend {
	path := filepath.Join(t.TempDir(), "leases.db")
	db := openSQLite(t, path)
	return leasetest.Backend{
		Store: newSQLiteStore(t, db, opts),
		Peer: func(t *testing.T) optimistic.LeaseStore {
			return newSQLiteStore(t, openSQLite(t, path), opts)
		},
		SetField: func(t *testing.T, keyID, field string, value *string) {
			t.Helper()
			// field becomes part of the statement: only the suite's names.
			require.Contains(t, []string{"max_concurrent_uses", "cooldown_until"}, field)
			var v any
			if value != nil {
				v = *value
			}
			res, err := db.Exec(`UPDATE lease_keys SET `+field+` = ? WHERE id = ?`, v, keyID)
			require.NoError(t, err)
			n, err := res.RowsAffected()
			require.NoError(t, err)
			require.Equal(t, int64(1), n, "key %s", keyID)
		},
		Find: func(t *testing.T, s string) []string { return findInSQLite(t, db.DB, s) },
		// A closed *sql.DB fails every later call, as an unreachable store.
		Stop: func(*testing.T) { _ = db.Close() },
	}
}

// findInSQLite lists every table whose name, and every cell whose value,
// contains s, over all tables of the file.
func findInSQLite(t *testing.T, db *sql.DB, s string) []string {
	t.Helper()
	rows, err := db.Query(`SELECT name FROM sqlite_schema WHERE type = 'table'`)
	require.NoError(t, err)
	var tables []string
	for rows.Next() {
		var name string
		require.NoError(t, rows.Scan(&name))
		tables = append(tables, name)
	}
	require.NoError(t, rows.Err())
	var found []string
	for _, table := range tables {
		if strings.Contains(table, s) {
			found = append(found, table)
		}
		rows, err := db.Query(`SELECT * FROM "` + table + `"`)
		require.NoError(t, err)
		cols, err := rows.Columns()
		require.NoError(t, err)
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		for rows.Next() {
			require.NoError(t, rows.Scan(ptrs...))
			for i, v := range vals {
				text := fmt.Sprint(v)
				if b, ok := v.([]byte); ok {
					text = string(b)
				}
				if strings.Contains(text, s) {
					found = append(found, fmt.Sprintf("%s.%s=%s", table, cols[i], text))
				}
			}
		}
		require.NoError(t, rows.Err())
	}
	return found
}

func TestSQLiteConformance(t *testing.T) {
	leasetest.Run(t, sqliteBackend)
}

// Two stores on one file are two processes: SQLite's busy handler is not
// fair between them, and under this load one can wait out the default
// busy retries (2 s), which the service would answer 429 contended. The
// stress test asks for correctness, so it gives them more patience.
func TestSQLiteStress(t *testing.T) {
	patient := &sqlitestore.Options{Busy: retry.Policy{MaxRetries: 1000, MaxElapsed: time.Minute}}
	leasetest.Stress(t, func(t *testing.T) leasetest.Backend { return sqliteBackendWith(t, patient) }, 3*time.Second)
}

// mode=ro rather than chmod: tests may run as root, which ignores file modes.
func TestSQLiteReadOnlyFileIsStoreError(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "leases.db")
	db := openSQLite(t, path)
	require.NoError(t, newSQLiteStore(t, db, nil).SyncKey(ctx, optimistic.KeyState{
		ID: "k", Provider: "openai", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: 1,
	}))
	require.NoError(t, db.Close())

	ro, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_txlock=immediate")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ro.Close() })
	store := newSQLiteStore(t, sqlitex.Wrap(ro), nil)

	_, _, err = store.Allocate(ctx, optimistic.AllocateRequest{
		Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute,
	})
	require.ErrorIs(t, err, optimistic.ErrStore)
	require.NotErrorIs(t, err, optimistic.ErrNoCapacity)
	require.NotErrorIs(t, err, optimistic.ErrContended)

	infos, err := store.Inspect(ctx, "k")
	require.NoError(t, err, "reads still work")
	require.True(t, infos[0].Exists)
	require.Zero(t, infos[0].Live)
}

// A corrupt file is a store failure, never "full" or "contended".
func TestSQLiteCorruptFileIsStoreError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	db, err := sqlitex.Open(path)
	require.NoError(t, err)
	store := newSQLiteStore(t, db, nil)
	require.NoError(t, store.SyncKey(context.Background(), optimistic.KeyState{
		ID: "k", Provider: "openai", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: 1,
	}))
	require.NoError(t, db.Close())

	// Keep page 1 (header and schema), overwrite every table page.
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Greater(t, len(raw), 4096)
	for i := 4096; i < len(raw); i++ {
		raw[i] = 0xA5
	}
	require.NoError(t, os.WriteFile(path, raw, 0o600))

	_, err = sqlitestore.New(context.Background(), openSQLite(t, path), nil)
	require.ErrorIs(t, err, optimistic.ErrStore)
	require.NotErrorIs(t, err, optimistic.ErrNoCapacity)
	require.NotErrorIs(t, err, optimistic.ErrContended)
}

// A file whose write lock another connection keeps is contended, not full:
// the store retries within its budget and then says so.
func TestSQLiteLockedFileIsContended(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "leases.db")
	holder := openSQLite(t, path)
	require.NoError(t, newSQLiteStore(t, holder, nil).SyncKey(ctx, optimistic.KeyState{
		ID: "k", Provider: "openai", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: 1,
	}))
	// A short busy_timeout keeps each try quick.
	db, err := sql.Open("sqlite", path+"?_txlock=immediate&_pragma=busy_timeout(10)")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store := newSQLiteStore(t, sqlitex.Wrap(db), &sqlitestore.Options{Busy: retry.Policy{MaxRetries: 2}})

	lock, err := holder.BeginTx(ctx, nil)
	require.NoError(t, err)
	req := optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute}
	_, st, err := store.Allocate(ctx, req)
	require.ErrorIs(t, err, optimistic.ErrContended)
	require.NotErrorIs(t, err, optimistic.ErrNoCapacity)
	require.NotErrorIs(t, err, optimistic.ErrStore)
	require.Equal(t, optimistic.Stats{Attempts: 3, Conflicts: 3}, st, "every try found the file busy")

	require.NoError(t, lock.Rollback())
	_, st, err = store.Allocate(ctx, req)
	require.NoError(t, err)
	require.Equal(t, optimistic.Stats{Attempts: 1}, st)
}

// A caller whose deadline ends while the file stays locked learns both
// why the store was retrying (busy: a conflict) and why it stopped.
func TestSQLiteLockedUntilDeadlineKeepsBothCauses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	holder := openSQLite(t, path)
	require.NoError(t, newSQLiteStore(t, holder, nil).SyncKey(t.Context(), optimistic.KeyState{
		ID: "k", Provider: "openai", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: 1,
	}))
	db, err := sql.Open("sqlite", path+"?_txlock=immediate&_pragma=busy_timeout(5)")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store := newSQLiteStore(t, sqlitex.Wrap(db), &sqlitestore.Options{Busy: retry.Policy{MaxRetries: 1000, MaxElapsed: time.Hour}})
	lock, err := holder.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback() }()

	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, _, err = store.Allocate(ctx, optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, optimistic.ErrConflict, "the busy cause is kept")
	require.NotErrorIs(t, err, optimistic.ErrStore)
	require.NotErrorIs(t, err, optimistic.ErrNoCapacity)
}

// New migrates under the caller's ctx.
func TestSQLiteNewHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := sqlitestore.New(ctx, openSQLite(t, filepath.Join(t.TempDir(), "leases.db")), nil)
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, optimistic.ErrStore)
}

// sqliteHelperEnv names the shared file for TestSQLiteHelperProcess.
const sqliteHelperEnv = "CREDPOOL_SQLITE_HELPER_FILE"

// TestSQLiteHelperProcess is the child of TestSQLiteTwoProcessesOneHolder,
// started as a separate process by re-running the test binary; it does
// nothing in a normal run. For a second, and until it has held it at
// least 5 times (a loaded machine may start one process late, or starve
// it; at most 30 s), it takes the limit-1 key "k" of the shared file,
// holds it about a millisecond, and prints each hold as
// "hold <fence> <start ns> <end ns>" before releasing it.
func TestSQLiteHelperProcess(t *testing.T) {
	path := os.Getenv(sqliteHelperEnv)
	if path == "" {
		return
	}
	ctx := context.Background()
	store := newSQLiteStore(t, openSQLite(t, path), nil)
	req := optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute}
	start, held := time.Now(), 0
	for time.Since(start) < time.Second || held < 5 && time.Since(start) < 30*time.Second {
		l, _, err := store.Allocate(ctx, req)
		if errors.Is(err, optimistic.ErrNoCapacity) || errors.Is(err, optimistic.ErrContended) {
			time.Sleep(100 * time.Microsecond)
			continue
		}
		require.NoError(t, err)
		from := time.Now().UnixNano()
		time.Sleep(time.Millisecond)
		fmt.Printf("hold %d %d %d\n", l.Fence, from, time.Now().UnixNano())
		require.NoError(t, store.Release(ctx, l.LeaseRef))
		held++
	}
}

// Two OS processes race on one limit-1 key in a shared file: ordered by
// fencing token, every hold starts after the previous one ended, and the
// fence counts every grant.
func TestSQLiteTwoProcessesOneHolder(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "leases.db")
	store := newSQLiteStore(t, openSQLite(t, path), nil)
	require.NoError(t, store.SyncKey(ctx, optimistic.KeyState{
		ID: "k", Provider: "openai", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: 1,
	}))

	type hold struct {
		proc              int
		fence, start, end int64
	}
	cmds := make([]*exec.Cmd, 2)
	outs := make([]*bytes.Buffer, len(cmds))
	for i := range cmds {
		cmds[i] = exec.Command(os.Args[0], "-test.run=^TestSQLiteHelperProcess$", "-test.count=1")
		cmds[i].Env = append(os.Environ(), sqliteHelperEnv+"="+path)
		outs[i] = new(bytes.Buffer)
		cmds[i].Stdout, cmds[i].Stderr = outs[i], outs[i]
		require.NoError(t, cmds[i].Start())
	}
	var holds []hold
	perProc := make([]int, len(cmds))
	for i, cmd := range cmds {
		require.NoError(t, cmd.Wait(), "helper %d:\n%s", i, outs[i])
		sc := bufio.NewScanner(outs[i])
		for sc.Scan() {
			h := hold{proc: i}
			if _, err := fmt.Sscanf(sc.Text(), "hold %d %d %d", &h.fence, &h.start, &h.end); err == nil {
				holds = append(holds, h)
				perProc[i]++
			}
		}
	}
	for i, n := range perProc {
		require.Positive(t, n, "helper %d never got the key", i)
	}
	slices.SortFunc(holds, func(a, b hold) int { return cmp.Compare(a.fence, b.fence) })
	for i := 1; i < len(holds); i++ {
		prev, cur := holds[i-1], holds[i]
		require.Less(t, prev.fence, cur.fence, "fence %d granted twice", cur.fence)
		require.GreaterOrEqual(t, cur.start, prev.end,
			"fence %d (helper %d) started before fence %d (helper %d) ended", cur.fence, cur.proc, prev.fence, prev.proc)
	}
	infos, err := store.Inspect(ctx, "k")
	require.NoError(t, err)
	require.Zero(t, infos[0].Live)
	require.Equal(t, holds[len(holds)-1].fence, infos[0].Fence, "the last grant was a recorded hold")
	t.Logf("%d holds: %v per helper", len(holds), perProc)
}
