package broker_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/sqlitestore"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
)

// A catalog that stays locked past its retries answers what
// sqlitex.Classify makes of SQLITE_BUSY: ErrContended. That is the
// catalog's failure (503 catalog_unavailable), not a hot pool (429
// contended): the slot goes back and the request ends.
func TestLockedCatalogDuringConfirmIs503(t *testing.T) {
	e := newEnv(t, key("a", "default", 1))
	locked := fmt.Errorf("%w: catalog: get key: %w", optimistic.ErrContended, errInjected) // = sqlitex.Classify of a busy error
	c := &flakyCatalog{Cache: e.cat, failRead: 1, readErr: locked}
	_, err := e.broker(c, e.store).Allocate(t.Context(), req("default"))
	t.Logf("answer: %v", err)
	require.Zero(t, e.live(t, "a"), "the slot was given back")
	require.ErrorIs(t, err, broker.ErrCatalog, "a locked catalog is 503 catalog_unavailable")
}

// Nor is it a reason to go on to the fallback pool, as a hot pool is.
func TestLockedCatalogInVipDoesNotFallBack(t *testing.T) {
	e := newEnv(t, key("v", "vip", 1), key("d", "default", 1))
	locked := fmt.Errorf("%w: catalog: get key: %w", optimistic.ErrContended, errInjected)
	c := &flakyCatalog{Cache: e.cat, failRead: 1, readErr: locked}
	g, err := e.broker(c, e.store).Allocate(t.Context(), req("vip"))
	t.Logf("grant %q, err %v", g.KeyID, err)
	require.ErrorIs(t, err, broker.ErrCatalog)
}

// The realistic path: catalog and lease store on separate files, another
// process holds the catalog file's write lock (a long admin import, say)
// while an allocate repairs a key the store has not had yet: repair's
// write stays locked past its retries.
func TestLockedCatalogDuringRepairIs503(t *testing.T) {
	dir := t.TempDir()
	catDB, err := sqlitex.Open(filepath.Join(dir, "catalog.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = catDB.Close() })
	storeDB, err := sqlitex.Open(filepath.Join(dir, "store.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = storeDB.Close() })
	sqlCat, err := catalog.New(t.Context(), catDB, nil)
	require.NoError(t, err)
	cat := cache(t, sqlCat)
	store, err := sqlitestore.New(t.Context(), storeDB, nil)
	require.NoError(t, err)
	_, err = cat.Put(t.Context(), key("a", "default", 1)) // in the catalog, not yet in the store
	require.NoError(t, err)

	// Another process takes the catalog's write lock.
	other, err := sql.Open("sqlite", filepath.Join(dir, "catalog.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	conn, err := other.Conn(t.Context())
	require.NoError(t, err)
	_, err = conn.ExecContext(t.Context(), "BEGIN IMMEDIATE")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = conn.ExecContext(context.Background(), "ROLLBACK"); _ = conn.Close() })

	b := broker.New(cat, store, &broker.Options{Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	_, err = b.Allocate(t.Context(), req("default"))
	t.Logf("answer: %v", err)
	require.ErrorIs(t, err, broker.ErrCatalog, "a catalog locked past its retries is 503 catalog_unavailable")
	require.ErrorIs(t, err, optimistic.ErrContended)
	require.NotContains(t, err.Error(), optimistic.ErrContended.Error(), "the log names the catalog, not a lease store")
	require.ErrorContains(t, err, "gave up after repeated conflicts: database is locked")
}
