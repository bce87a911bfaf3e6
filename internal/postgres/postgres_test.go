package postgres_test

import (
	"database/sql"
	"net"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/postgres"
	"github.com/credpool/credpool/internal/retry"
	"github.com/credpool/credpool/test/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// Neither a URL that does not parse nor a server that does not answer
// puts the password in the error.
func TestOpenErrorsHideThePassword(t *testing.T) {
	_, err := postgres.Open(t.Context(), "postgres://u:hunter2@127.0.0.1:notaport/db")
	require.ErrorContains(t, err, "not a valid URL")
	require.NotContains(t, err.Error(), "hunter2")

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	_, err = postgres.Open(t.Context(), "postgres://u:hunter2@"+addr+"/db?sslmode=disable&connect_timeout=2")
	require.Error(t, err)
	require.NotContains(t, err.Error(), "hunter2")
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:hunter2@h/db":                                   "postgres://u:xxxxx@h/db",
		"postgres://u@h/db?password=hunter2&sslmode=disable":          "postgres://u@h/db?password=xxxxx&sslmode=disable",
		"postgresql://h/db?sslpassword=hunter2":                       "postgresql://h/db?sslpassword=xxxxx",
		"/var/lib/credpool/credpool.db":                               "/var/lib/credpool/credpool.db",
		"postgres://u@h/db?application_name=credpool&sslmode=require": "postgres://u@h/db?application_name=credpool&sslmode=require",
	} {
		require.Equal(t, want, postgres.Redact(in), in)
	}
}

func TestIsURL(t *testing.T) {
	require.True(t, postgres.IsURL("postgres://h/db"))
	require.True(t, postgres.IsURL("postgresql://h/db"))
	require.True(t, postgres.IsURL("PostgreSQL://h/db"))
	require.False(t, postgres.IsURL("host=h dbname=db"))
	require.False(t, postgres.IsURL("credpool.db"))
	require.False(t, postgres.IsURL("/var/lib/postgres/credpool.db"))
}

// Two transactions that write each other's reads cannot both commit under
// SERIALIZABLE: the loser's error is a conflict, classified as contended,
// and Write runs it again until it commits.
func TestWriteRetriesLostRaces(t *testing.T) {
	db := pgtest.Open(t)
	ctx := t.Context()
	_, err := db.ExecContext(ctx, `CREATE TABLE t (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO t VALUES (1, 0), (2, 0)`)
	require.NoError(t, err)

	race := func() error {
		opts := &sql.TxOptions{Isolation: sql.LevelSerializable}
		a, err := db.BeginTx(ctx, opts)
		require.NoError(t, err)
		defer a.Rollback()
		b, err := db.BeginTx(ctx, opts)
		require.NoError(t, err)
		defer b.Rollback()
		for _, step := range []struct {
			tx   *sql.Tx
			stmt string
		}{
			{a, `UPDATE t SET n = (SELECT n FROM t WHERE id = 2) + 1 WHERE id = 1`},
			{b, `UPDATE t SET n = (SELECT n FROM t WHERE id = 1) + 1 WHERE id = 2`},
		} {
			_, err := step.tx.ExecContext(ctx, step.stmt)
			require.NoError(t, err)
		}
		require.NoError(t, a.Commit())
		return b.Commit()
	}
	err = race()
	require.True(t, postgres.Conflict(err), "got %v", err)

	tries := 0
	err = db.Write(ctx, retry.Policy{}, func(tx *sql.Tx) error {
		tries++
		if tries == 1 {
			return race()
		}
		_, err := tx.ExecContext(ctx, `UPDATE t SET n = n + 1 WHERE id = 1`)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, 2, tries)
}
