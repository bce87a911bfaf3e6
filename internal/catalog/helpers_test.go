package catalog_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/postgres"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/internal/sqlitex/sqlitextest"
	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/test/pgtest"
)

// openDB opens the SQLite file at path the way the service does.
func openDB(t *testing.T, path string) *sqlitex.DB { return sqlitextest.Open(t, path) }

// openers open a file the way the service does, and with plain deferred
// BEGIN and no foreign keys, as a DSN without parameters does: the catalog
// must work on both.
var openers = map[string]func(t *testing.T, path string) *sqlitex.DB{
	"sqlitex.Open": openDB,
	"plain": func(t *testing.T, path string) *sqlitex.DB {
		t.Helper()
		db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return sqlitex.Wrap(db)
	},
}

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// database is a test's empty catalog database on one engine.
type database struct {
	// DB runs the test's own statements (no placeholders: the engines
	// spell them differently).
	*sql.DB
	// New opens a catalog on the database with connections of its own,
	// as another process would.
	New func(ctx context.Context, opts *catalog.Options) (*catalog.SQL, error)
}

// open is New for a catalog the test expects to open.
func (db database) open(t *testing.T, opts *catalog.Options) *catalog.SQL {
	t.Helper()
	c, err := db.New(t.Context(), opts)
	require.NoError(t, err)
	return c
}

// engines runs body once per catalog engine, SQLite and PostgreSQL (a
// real server), each time on a fresh database.
func engines(t *testing.T, body func(t *testing.T, db database)) {
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "credpool.db")
		body(t, database{DB: openDB(t, path).DB, New: func(ctx context.Context, opts *catalog.Options) (*catalog.SQL, error) {
			return catalog.New(ctx, openDB(t, path), opts)
		}})
	})
	t.Run("postgres", func(t *testing.T) {
		url := pgtest.URL(t)
		open := func() *postgres.DB {
			db, err := postgres.Open(t.Context(), url)
			require.NoError(t, err)
			t.Cleanup(func() { _ = db.Close() })
			return db
		}
		body(t, database{DB: open().DB, New: func(ctx context.Context, opts *catalog.Options) (*catalog.SQL, error) {
			return catalog.NewPostgres(ctx, open(), opts)
		}})
	})
}

// newCatalog returns a catalog on a fresh SQLite file, and its database:
// for what only SQLite has.
func newCatalog(t *testing.T) (*catalog.SQL, *sqlitex.DB) {
	t.Helper()
	db := sqlitextest.Temp(t)
	c, err := catalog.New(t.Context(), db, nil)
	require.NoError(t, err)
	return c, db
}

const secret = "sk-live-0123456789abcdef"

func testKey(id string) catalog.Key {
	return catalog.Key{
		ID: id, Provider: "openai", Pool: "default",
		Models: []string{"gpt-4o"}, Secret: secret,
		Status: optimistic.StatusAvailable, MaxConcurrentUses: 2,
	}
}

func put(t *testing.T, c *catalog.SQL, k catalog.Key) catalog.Key {
	t.Helper()
	stored, err := c.Put(t.Context(), k)
	require.NoError(t, err)
	return stored
}

func get(t *testing.T, c *catalog.SQL, id string) catalog.Key {
	t.Helper()
	k, err := c.Get(t.Context(), id)
	require.NoError(t, err)
	return k
}

// noSecret is k as Put, List and Report return it: without its secret.
func noSecret(k catalog.Key) catalog.Key {
	k.Secret = ""
	return k
}

// newCache returns a Cache over c, closed when the test ends.
func newCache(t *testing.T, c *catalog.SQL, opts *catalog.CacheOptions) *catalog.Cache {
	t.Helper()
	cc, err := catalog.NewCache(t.Context(), c, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, cc.Close(context.Background())) })
	return cc
}
