package handlers_test

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/handlers"
	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/test/openapitest"
)

// failing answers every call of the broker with err.
type failing struct{ err error }

func (f *failing) Allocate(context.Context, broker.Request) (broker.Grant, error) {
	return broker.Grant{}, f.err
}
func (f *failing) Release(context.Context, optimistic.LeaseRef) error { return f.err }
func (f *failing) Renew(context.Context, optimistic.LeaseRef, time.Duration) (time.Time, error) {
	return time.Time{}, f.err
}
func (f *failing) Report(context.Context, optimistic.LeaseRef, catalog.Outcome, time.Duration) error {
	return f.err
}
func (f *failing) Put(context.Context, catalog.Key) (catalog.Key, error) { return catalog.Key{}, f.err }
func (f *failing) Update(context.Context, string, catalog.Patch) (catalog.Key, error) {
	return catalog.Key{}, f.err
}
func (f *failing) PutMany(context.Context, ...catalog.Key) ([]catalog.Key, error) {
	return nil, f.err
}
func (f *failing) Keys(context.Context) ([]broker.KeyView, error) { return nil, f.err }
func (f *failing) Key(context.Context, string) (broker.KeyView, error) {
	return broker.KeyView{}, f.err
}
func (f *failing) Delete(context.Context, string) error                   { return f.err }
func (f *failing) ClearLeases(context.Context, string) (int, error)       { return 0, f.err }
func (f *failing) Sync(context.Context) (int, error)                      { return 0, f.err }
func (f *failing) SetAlias(context.Context, string, string, string) error { return f.err }
func (f *failing) DeleteAlias(context.Context, string, string) error      { return f.err }
func (f *failing) Aliases(context.Context) ([]catalog.Alias, error)       { return nil, f.err }
func (f *failing) Ready(context.Context) error                            { return f.err }
func (f *failing) Losses(context.Context) (broker.LossReport, error)      { return broker.LossReport{}, nil }

// Every error statusFor maps, answered by the broker on every route that
// calls it, gets an answer the OpenAPI document lists for that route, in
// its shape: a code added to statusFor, or a route added to the service,
// fails here until the document has it. Only the pairs that cannot
// happen are left out, each with its reason.
func TestOpenAPIHasEveryErrorOfEveryRoute(t *testing.T) {
	const ref = `{"provider":"openai","pool":"default","key_id":"k","lease_id":"l"}`
	const key = `"provider":"openai","pool":"default","models":["m"],"secret":"sk"`
	routes := []struct{ method, route, path, body string }{
		{"POST", "", "/api/internal/allocate-key", `{"provider":"openai","model":"m"}`},
		{"POST", "", "/api/internal/renew", ref},
		{"POST", "", "/api/internal/release", ref},
		{"POST", "", "/api/internal/report", strings.Replace(ref, "}", `,"outcome":"success"}`, 1)},
		{"GET", "", "/api/admin/keys", ""},
		{"PUT", "", "/api/admin/keys", `[{"id":"k",` + key + `}]`},
		{"GET", "/api/admin/keys/:id", "/api/admin/keys/k", ""},
		{"PUT", "/api/admin/keys/:id", "/api/admin/keys/k", `{` + key + `}`},
		{"PATCH", "/api/admin/keys/:id", "/api/admin/keys/k", `{"status":"disabled"}`},
		{"DELETE", "/api/admin/keys/:id", "/api/admin/keys/k", ""},
		{"POST", "/api/admin/keys/:id/clear-leases", "/api/admin/keys/k/clear-leases", ""},
		{"POST", "", "/api/admin/sync", ""},
		{"GET", "", "/api/admin/aliases", ""},
		{"PUT", "/api/admin/aliases/:provider/:alias", "/api/admin/aliases/openai/fast", `{"model":"m"}`},
		// Another alias: only a delete can find none.
		{"DELETE", "/api/admin/aliases/:provider/:alias", "/api/admin/aliases/openai/old", ""},
		{"GET", "", "/readyz", ""},
	}
	byName := func(paths ...string) func(string) bool {
		return func(p string) bool { return slices.Contains(paths, p) }
	}
	// cannot says, per code, on which routes the broker never answers it.
	cannot := map[string]func(path string) bool{
		// Only an allocation resolves candidates, takes a slot and records
		// a request id.
		"no_candidates":     func(p string) bool { return p != "/api/internal/allocate-key" },
		"policy_conflict":   func(p string) bool { return p != "/api/internal/allocate-key" },
		"request_in_flight": func(p string) bool { return p != "/api/internal/allocate-key" },
		"request_id_reused": func(p string) bool { return p != "/api/internal/allocate-key" },
		"pool_exhausted":    func(p string) bool { return p != "/api/internal/allocate-key" },
		// Only an allocation waits for a slot.
		"shutting_down": func(p string) bool { return p != "/api/internal/allocate-key" },
		// A key missing from the catalog is reported only when read by its
		// id; renew, release and report turn it into a lost lease.
		"key_not_found": func(p string) bool { return !strings.HasPrefix(p, "/api/admin/keys/") },
		// Only a delete of an alias can find it missing; a set creates it.
		"alias_not_found": func(p string) bool { return p != "/api/admin/aliases/openai/old" },
		// Only a lease's routes meet a lost lease; an allocation replaying a
		// lost one grants afresh.
		"lease_lost": func(p string) bool {
			return !byName("/api/internal/renew", "/api/internal/release", "/api/internal/report")(p)
		},
		// Release and report answer a wrong owner with 200 owner_mismatch;
		// only a renewal fails on it.
		"owner_mismatch": func(p string) bool { return p != "/api/internal/renew" },
		// Routes without input have nothing to be invalid.
		"invalid_request": byName("/api/admin/keys", "/api/admin/sync", "/api/admin/aliases", "/readyz"),
		// Aliases live in the catalog alone, whose busy is catalog_unavailable.
		"contended": byName("/api/admin/aliases", "/api/admin/aliases/openai/fast", "/api/admin/aliases/openai/old"),
	}

	stub := &failing{}
	h, err := handlers.New(handlers.Config{
		Service: stub, Admin: stub, Metrics: handlers.NewMetrics(),
		InternalKey: "internal-key-0123456789", AdminKey: "admin-key-0123456789",
		Store: "sqlite", Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	var served, driven []string
	for _, r := range h.(*gin.Engine).Routes() {
		if !slices.Contains([]string{"/healthz", "/metrics", "/openapi.yaml"}, r.Path) {
			served = append(served, r.Method+" "+r.Path)
		}
	}
	for _, r := range routes {
		driven = append(driven, r.method+" "+cmp.Or(r.route, r.path))
	}
	require.ElementsMatch(t, served, driven, "every route that calls the broker is driven")

	srv := httptest.NewServer(h)
	defer srv.Close()
	hc := openapitest.Client(srv.Client())
	for _, sentinel := range append(handlers.MappedErrors(), errors.New("a bug")) {
		_, code := handlers.StatusFor(sentinel)
		for _, r := range routes {
			if skip := cannot[code]; skip != nil && skip(r.path) {
				continue
			}
			stub.err = sentinel
			req, err := http.NewRequest(r.method, srv.URL+r.path, strings.NewReader(r.body))
			require.NoError(t, err)
			req.Header.Set("X-Internal-Key", "internal-key-0123456789")
			req.Header.Set("X-Admin-Key", "admin-key-0123456789")
			resp, err := hc.Do(req)
			require.NoError(t, err, "%s %s answering %s", r.method, r.path, code)
			require.NoError(t, resp.Body.Close())
			status, _ := handlers.StatusFor(sentinel)
			switch {
			case r.path == "/readyz":
				status = http.StatusServiceUnavailable
			case code == "lease_lost" && r.path != "/api/internal/renew":
				status = http.StatusOK // released false: nothing to release
			}
			require.Equal(t, status, resp.StatusCode, "%s %s answering %s", r.method, r.path, code)
		}
	}
}
