package test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/test/openapitest"
)

// The served document is the embedded one, and the validator catches an
// answer of the wrong shape, status or code, and a request the document
// calls invalid that the service would have accepted.
func TestOpenAPIValidatorCatchesWrongShapes(t *testing.T) {
	s := startService(t, serviceOptions{sqlite: true})
	code, h, _ := s.call(t, http.MethodGet, "/openapi.yaml", "", "", nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "application/yaml", h.Get("Content-Type"))

	const grant = `{"key_id":"k","lease_id":"l","fencing_token":7,"pool":"default","provider_model":"m","lease_until":"2026-11-30T12:00:00Z","credential":{"api_key":"sk"}}`
	alloc := `{"provider":"openai","model":"m"}`
	for _, c := range []struct {
		name, method, path, body string
		status                   int
		answer                   string
		ok                       bool
	}{
		{"a right grant", "POST", "/api/internal/allocate-key", alloc, 200, grant, true},
		{"a grant without its credential", "POST", "/api/internal/allocate-key", alloc, 200, strings.Replace(grant, `,"credential":{"api_key":"sk"}`, "", 1), false},
		{"a fencing token as a string", "POST", "/api/internal/allocate-key", alloc, 200, strings.Replace(grant, `7`, `"7"`, 1), false},
		{"an extra field", "POST", "/api/internal/allocate-key", alloc, 200, strings.Replace(grant, `{`, `{"extra":1,`, 1), false},
		{"a code the status does not have", "POST", "/api/internal/allocate-key", alloc, 429, `{"error":{"code":"lease_lost","message":"x"}}`, false},
		{"an undocumented status", "POST", "/api/internal/allocate-key", alloc, 418, `{"error":{"code":"internal","message":"x"}}`, false},
		{"an error without a message", "POST", "/api/internal/renew", `{"provider":"p","pool":"d","key_id":"k","lease_id":"l"}`, 410, `{"error":{"code":"lease_lost"}}`, false},
		{"a key view with its secret", "GET", "/api/admin/keys/k", "", 200, `{"id":"k","provider":"p","pool":"d","models":["m"],"status":"available","max_concurrent_uses":1,"live_leases":0,"in_store":true,"successes":0,"errors":0,"rate_limit_hits":0,"secret":"sk"}`, false},
		{"a released answer with a reason", "POST", "/api/internal/release", `{"provider":"p","pool":"d","key_id":"k","lease_id":"l"}`, 200, `{"released":true,"reason":"owner_mismatch"}`, false},
		{"an invalid request accepted", "POST", "/api/internal/allocate-key", `{"provider":"openai","model":"m","surprise":1}`, 200, grant, false},
		{"an invalid request refused", "POST", "/api/internal/allocate-key", `{"provider":"openai","model":"m","surprise":1}`, 400, `{"error":{"code":"invalid_request","message":"unknown field surprise","field":"surprise"}}`, true},
		{"an alias without its model accepted", "PUT", "/api/admin/aliases/openai/fast", `{}`, 200, `{"provider":"openai","alias":"fast","model":""}`, false},
		{"a renewal refused as contended", "POST", "/api/internal/renew", `{"provider":"p","pool":"d","key_id":"k","lease_id":"l"}`, 429, `{"error":{"code":"contended","message":"x"}}`, true},
		{"no route answered 200", "GET", "/nowhere", "", 200, `{}`, false},
		{"no route answered 404", "GET", "/nowhere", "", 404, `{"error":{"code":"not_found","message":"no such endpoint"}}`, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json; charset=utf-8")
				w.WriteHeader(c.status)
				_, _ = io.WriteString(w, c.answer)
			}))
			defer fake.Close()
			var body io.Reader
			if c.body != "" {
				body = strings.NewReader(c.body)
			}
			req, err := http.NewRequest(c.method, fake.URL+c.path, body)
			require.NoError(t, err)
			req.Header.Set("X-Internal-Key", internalKey)
			req.Header.Set("X-Admin-Key", adminKey)
			resp, err := openapitest.Client(nil).Do(req)
			if c.ok {
				require.NoError(t, err)
				require.NoError(t, resp.Body.Close())
				return
			}
			require.ErrorContains(t, err, "openapi:")
		})
	}
}
