package handlers

import (
	"context"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
)

// routeStub satisfies New; the routes are listed, never called.
type routeStub struct {
	Service
	Admin
}

func (routeStub) Losses(context.Context) (broker.LossReport, error) { return broker.LossReport{}, nil }

// The document is valid OpenAPI 3.1 and lists exactly the routes New
// serves, each with its method; GET /openapi.yaml serves it. (Whether
// every answer matches it is test/openapitest's, and codes_test.go's.)
func TestOpenAPIListsEveryRoute(t *testing.T) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(OpenAPI())
	require.NoError(t, err)
	require.NoError(t, doc.Validate(loader.Context))
	require.True(t, doc.IsOpenAPI31OrLater())

	var documented []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented = append(documented, method+" "+path)
		}
	}
	h, err := New(Config{
		Service: routeStub{}, Admin: routeStub{}, Metrics: NewMetrics(),
		InternalKey: "internal-key-0123456789", AdminKey: "admin-key-0123456789",
	})
	require.NoError(t, err)
	param := regexp.MustCompile(`:([a-z_]+)`)
	var served []string
	for _, r := range h.(*gin.Engine).Routes() {
		served = append(served, r.Method+" "+param.ReplaceAllString(r.Path, "{$1}"))
	}
	slices.Sort(documented)
	slices.Sort(served)
	require.Equal(t, served, documented)

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/openapi.yaml", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, string(OpenAPI()), rec.Body.String())
	require.True(t, strings.HasPrefix(rec.Header().Get("Content-Type"), "application/yaml"))
}
