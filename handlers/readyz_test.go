package handlers_test

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/handlers"
	"github.com/credpool/credpool/optimistic"
)

// /readyz by the lease store's last node checks: ok with every server
// taking writes (or none checked), degraded with some, unavailable with
// none, even though every ping passes.
func TestReadyzByNodes(t *testing.T) {
	refused := errors.New("refuses writes: NOREPLICAS Not enough good replicas to write.")
	for _, c := range []struct {
		name  string
		nodes []optimistic.NodeHealth
		code  int
		body  map[string]any
	}{
		{"not checked", nil, http.StatusOK, map[string]any{"status": "ok", "store": "redis"}},
		{"all take writes", []optimistic.NodeHealth{{Addr: "a"}, {Addr: "b"}}, http.StatusOK,
			map[string]any{"status": "ok", "store": "redis"}},
		{"some refuse", []optimistic.NodeHealth{{Addr: "a", Err: refused}, {Addr: "b"}}, http.StatusOK,
			map[string]any{"status": "degraded", "store": "redis", "store_nodes": map[string]any{"up": 1.0, "down": 1.0}}},
		{"all refuse", []optimistic.NodeHealth{{Addr: "a", Err: refused}}, http.StatusServiceUnavailable,
			map[string]any{"status": "unavailable", "store": "redis", "error": "store_unavailable"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := handlers.Config{
				Service: &failing{}, Admin: &failing{}, Metrics: handlers.NewMetrics(),
				InternalKey: "internal-key-0123456789", AdminKey: "admin-key-0123456789",
				Store: "redis", Logger: slog.New(slog.DiscardHandler),
			}
			if c.nodes != nil {
				cfg.Nodes = func() []optimistic.NodeHealth { return c.nodes }
			}
			h, err := handlers.New(cfg)
			require.NoError(t, err)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			require.Equal(t, c.code, rec.Code)
			var body map[string]any
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
			require.Equal(t, c.body, body)
		})
	}
}
