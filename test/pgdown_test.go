package test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/pgproc"
)

// A PostgreSQL catalog that goes away (its server stopped) under a
// running service: an allocate answers 503 catalog_unavailable, never a
// grant without the catalog's re-check and never 429 (also on a full
// pool), and /readyz says the catalog is not ready.
func TestHTTPPostgresCatalogDown(t *testing.T) {
	srv, err := pgproc.Run()
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	require.NoError(t, srv.CreateDB(t.Context(), "credpool"))
	s := startService(t, serviceOptions{postgres: srv.URL("credpool")})
	s.putKey(t, "k1", "default", 2, nil)
	for range 2 {
		code, _, g := s.internal(t, "allocate-key", allocBody("default"))
		require.Equal(t, http.StatusOK, code, "%v", g)
	}
	code, _, full := s.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusTooManyRequests, code, "%v", full)

	// Full, and then the catalog goes: "full" would be an answer the
	// catalog cannot back now.
	srv.Stop()
	code, _, out := s.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusServiceUnavailable, code, "%v", out)
	require.Equal(t, "catalog_unavailable", errCode(out))
	code, _, out = s.call(t, http.MethodGet, "/readyz", "", "", nil)
	require.Equal(t, http.StatusServiceUnavailable, code, "%v", out)
}
