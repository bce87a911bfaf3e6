package sqlitex_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/requestlog"
	"github.com/credpool/credpool/internal/retry"
	"github.com/credpool/credpool/internal/sqlitestore"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
)

// holdGate runs a write on db that holds db's gate until release is called.
func holdGate(t *testing.T, db *sqlitex.DB) (release func()) {
	t.Helper()
	entered, done, errc := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		errc <- db.Write(context.Background(), retry.Policy{}, func(*sql.Tx, int64) error {
			close(entered)
			<-done
			return nil
		})
	}()
	<-entered
	return func() {
		close(done)
		require.NoError(t, <-errc)
	}
}

// The catalog, the lease store and the request log on one DB queue their
// writes on its one gate: while a write holds it, each of theirs waits
// until its ctx ends. The file begins transactions deferred, so the holder
// takes no SQLite lock: a writer with a gate of its own would go through.
func TestWritersShareOneGate(t *testing.T) {
	raw, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "x.db")+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	require.NoError(t, err)
	t.Cleanup(func() { _ = raw.Close() })
	db := sqlitex.Wrap(raw)
	cat, err := catalog.New(t.Context(), db, nil)
	require.NoError(t, err)
	store, err := sqlitestore.New(t.Context(), db, nil)
	require.NoError(t, err)
	requests, err := requestlog.NewSQLite(t.Context(), db)
	require.NoError(t, err)

	writes := map[string]func(ctx context.Context) error{
		"catalog": func(ctx context.Context) error {
			_, err := cat.Put(ctx, catalog.Key{
				ID: "k", Provider: "openai", Pool: "default", Models: []string{"gpt-4o"},
				Secret: "sk-test", Status: optimistic.StatusAvailable, MaxConcurrentUses: 1,
			})
			return err
		},
		"lease store": func(ctx context.Context) error {
			return store.SyncKey(ctx, optimistic.KeyState{
				ID: "k", Provider: "openai", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: 1,
			})
		},
		"request log": func(ctx context.Context) error {
			_, _, err := requests.Claim(ctx, "r1", "tok", "f", time.Minute)
			return err
		},
	}
	for name, write := range writes {
		release := holdGate(t, db)
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		err := write(ctx)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "%s waited for the gate", name)
		release()
		require.NoError(t, write(t.Context()), "%s, the gate free", name)
	}
}
