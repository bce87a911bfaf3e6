package catalog_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/sqlitex"
)

// versions returns how many schema steps are recorded, and how many
// distinct ones.
func versions(t *testing.T, db *sqlitex.DB) (rows, distinct int) {
	t.Helper()
	require.NoError(t, db.QueryRowContext(t.Context(),
		`SELECT COUNT(*), COUNT(DISTINCT version) FROM catalog_schema`).Scan(&rows, &distinct))
	return rows, distinct
}

func TestNewIsIdempotent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "credpool.db")
	db := openDB(t, path)
	c, err := catalog.New(t.Context(), db, nil)
	require.NoError(t, err)
	put(t, c, testKey("k1"))

	again, err := catalog.New(t.Context(), openDB(t, path), nil)
	require.NoError(t, err)
	require.Equal(t, secret, get(t, again, "k1").Secret.Reveal())

	rows, distinct := versions(t, db)
	require.Equal(t, rows, distinct)
	require.Positive(t, rows)
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

			rows, distinct := versions(t, dbs[0])
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
