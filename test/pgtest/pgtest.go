// Package pgtest is the testing face of internal/pgproc: one real
// PostgreSQL server per test binary, started on first use, and a fresh
// database on it per test. There is no fallback to a fake: if PostgreSQL
// is missing, the test fails and says how to install it.
//
// A package that uses it calls Main from its TestMain, which stops the
// server after the last test.
package pgtest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/credpool/credpool/internal/pgproc"
	"github.com/credpool/credpool/internal/postgres"
)

var (
	mainCalled atomic.Bool
	mu         sync.Mutex
	server     *pgproc.Server
	started    error
	databases  atomic.Int64
)

// Main runs the package's tests and then stops the server, if a test
// started one. Call it from TestMain: os.Exit(pgtest.Main(m)).
func Main(m *testing.M) int {
	mainCalled.Store(true)
	code := m.Run()
	mu.Lock()
	defer mu.Unlock()
	if server != nil {
		server.Stop()
	}
	return code
}

// URL creates a fresh, empty database for t and returns its URL. The
// database lives as long as the server, which Main stops.
func URL(t testing.TB) string {
	t.Helper()
	if !mainCalled.Load() {
		t.Fatal("pgtest: call pgtest.Main from the package's TestMain, so that the server is stopped")
	}
	srv, err := shared()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	name := fmt.Sprintf("t%d_%s", databases.Add(1), sanitize(t.Name()))
	if err := srv.CreateDB(context.Background(), name); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	return srv.URL(name)
}

// Open opens a fresh database for t with postgres.Open and closes it when
// t ends.
func Open(t testing.TB) *postgres.DB {
	t.Helper()
	db, err := postgres.Open(context.Background(), URL(t))
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// shared starts the server on first use; a failed start fails every
// later caller the same way.
func shared() (*pgproc.Server, error) {
	mu.Lock()
	defer mu.Unlock()
	if server == nil && started == nil {
		server, started = pgproc.Run()
	}
	return server, started
}

// sanitize keeps a database name short and plain: PostgreSQL cuts
// identifiers at 63 bytes.
func sanitize(name string) string {
	name = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return '_'
	}, name)
	if len(name) > 40 {
		name = name[:40]
	}
	return name
}
