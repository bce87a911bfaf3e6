package handlers

import (
	"bytes"
	_ "embed"
	"net/http"

	"github.com/gin-gonic/gin"
)

// openAPI is the OpenAPI 3.1 document of every route, status code and
// error code. The end-to-end tests validate every request and answer they
// exchange against it (test/openapitest), so it cannot drift.
//
//go:embed openapi.yaml
var openAPI []byte

// OpenAPI returns the API's OpenAPI 3.1 document, in YAML, as
// GET /openapi.yaml serves it.
func OpenAPI() []byte { return bytes.Clone(openAPI) }

func serveOpenAPI(c *gin.Context) { c.Data(http.StatusOK, "application/yaml", openAPI) }
