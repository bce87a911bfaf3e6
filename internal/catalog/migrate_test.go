package catalog_test

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/postgres"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/test/pgtest"
)

// versions returns how many schema steps are recorded, and how many
// distinct ones.
func versions(t *testing.T, db *sql.DB) (rows, distinct int) {
	t.Helper()
	require.NoError(t, db.QueryRowContext(t.Context(),
		`SELECT COUNT(*), COUNT(DISTINCT version) FROM catalog_schema`).Scan(&rows, &distinct))
	return rows, distinct
}

func TestNewIsIdempotent(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		put(t, db.open(t, nil), testKey("k1"))
		again := db.open(t, nil)
		require.Equal(t, secret, get(t, again, "k1").Secret.Reveal())

		rows, distinct := versions(t, db.DB)
		require.Equal(t, rows, distinct)
		require.Positive(t, rows)
	})
}

// A database migrated by a newer binary is refused, not written to.
func TestNewRefusesNewerSchema(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		db.open(t, nil)
		_, err := db.ExecContext(t.Context(), `INSERT INTO catalog_schema (version, applied_at) VALUES (99, 0)`)
		require.NoError(t, err)
		_, err = db.New(t.Context(), nil)
		require.ErrorContains(t, err, "newer than this binary knows")
	})
}

// Processes starting at once on a new PostgreSQL database, each with its
// own connections: the advisory lock has them migrate one after the other.
func TestNewConcurrentPostgres(t *testing.T) {
	url := pgtest.URL(t)
	const starts = 8
	errs := make(chan error, starts)
	for range starts {
		go func() {
			db, err := postgres.Open(t.Context(), url)
			if err == nil {
				defer db.Close()
				_, err = catalog.NewPostgres(t.Context(), db, nil)
			}
			errs <- err
		}()
	}
	for range starts {
		require.NoError(t, <-errs)
	}
	db, err := postgres.Open(t.Context(), url)
	require.NoError(t, err)
	defer db.Close()
	rows, distinct := versions(t, db.DB)
	require.Equal(t, rows, distinct)
}

// Processes starting at once, each with its own *sql.DB on the file.
func TestNewConcurrent(t *testing.T) {
	for name, open := range openers {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "credpool.db")
			dbs := []*sqlitex.DB{open(t, path), open(t, path)}
			const starts = 16
			errs := make(chan error, starts)
			for i := range starts {
				go func() {
					_, err := catalog.New(t.Context(), dbs[i%len(dbs)], nil)
					errs <- err
				}()
			}
			for range starts {
				require.NoError(t, <-errs)
			}

			rows, distinct := versions(t, dbs[0].DB)
			require.Equal(t, rows, distinct)
			c, err := catalog.New(t.Context(), dbs[1], nil)
			require.NoError(t, err)
			put(t, c, testKey("k1"))
			require.Equal(t, "k1", get(t, c, "k1").ID)
		})
	}
}

func TestNewRejectsNilDB(t *testing.T) {
	_, err := catalog.New(t.Context(), nil, nil)
	require.Error(t, err)
}
