// Package sqlitextest is the testing.TB face of internal/sqlitex: a SQLite
// file opened the way the service opens it, closed when the test ends.
package sqlitextest

import (
	"path/filepath"
	"testing"

	"github.com/credpool/credpool/internal/sqlitex"
)

// Open opens the file at path with sqlitex.Open and closes it when t ends.
func Open(t testing.TB, path string) *sqlitex.DB {
	t.Helper()
	db, err := sqlitex.Open(path)
	if err != nil {
		t.Fatalf("sqlitextest: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Temp opens a fresh file in t's temporary directory.
func Temp(t testing.TB) *sqlitex.DB {
	t.Helper()
	return Open(t, filepath.Join(t.TempDir(), "credpool.db"))
}
