// Package openapitest validates HTTP exchanges against the service's
// OpenAPI document (handlers/openapi.yaml) with kin-openapi and a JSON
// Schema 2020-12 engine. It is for tests only: end-to-end tests send
// through Client or Transport, so every request and answer they exchange
// proves the document.
package openapitest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/credpool/credpool/handlers"
)

// openAPI is the service's OpenAPI document, checked, a router over it,
// and its schemas compiled for the bodies.
type openAPI struct {
	doc    *openapi3.T
	router routers.Router

	// kin-openapi compiles a schema on every validation, which costs the
	// end-to-end tests' load loops most of their CPU; bodies are validated
	// by the same JSON Schema 2020-12 engine with each schema compiled
	// once, from the document itself.
	mu       sync.Mutex
	compiler *jsonschema.Compiler
	schemas  map[string]*jsonschema.Schema
}

// docURL names the document as a JSON Schema resource.
const docURL = "https://credpool.invalid/openapi.json"

// apiDoc loads handlers' document once per test binary.
var apiDoc = sync.OnceValues(func() (*openAPI, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(handlers.OpenAPI())
	if err != nil {
		return nil, fmt.Errorf("openapi: load: %w", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		return nil, fmt.Errorf("openapi: the document is invalid: %w", err)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("openapi: router: %w", err)
	}
	raw, err := doc.MarshalJSON()
	if err != nil {
		return nil, err
	}
	tree, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource(docURL, tree); err != nil {
		return nil, err
	}
	return &openAPI{doc: doc, router: router, compiler: c, schemas: map[string]*jsonschema.Schema{}}, nil
})

// schema is the document's schema at the JSON pointer ptr, compiled once.
func (a *openAPI) schema(ptr string) (*jsonschema.Schema, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s, ok := a.schemas[ptr]; ok {
		return s, nil
	}
	s, err := a.compiler.Compile(docURL + "#" + ptr)
	if err != nil {
		return nil, err
	}
	a.schemas[ptr] = s
	return s, nil
}

// pointer is the JSON pointer of the given document path.
func pointer(parts ...string) string {
	var b strings.Builder
	for _, p := range parts {
		b.WriteString("/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(p))
	}
	return b.String()
}

// checkBody validates a body of media type ct against the schema of
// content (at the pointer at) for that type; a body of a type the
// document does not list fails.
func (a *openAPI) checkBody(content openapi3.Content, at, ct string, raw []byte) error {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return fmt.Errorf("content type %q: %w", ct, err)
	}
	if content.Get(mt) == nil {
		return fmt.Errorf("content type %q is not in the document", mt)
	}
	s, err := a.schema(at + pointer("content", mt, "schema"))
	if err != nil {
		return err
	}
	var v any = string(raw)
	if mt == "application/json" {
		if v, err = jsonschema.UnmarshalJSON(bytes.NewReader(raw)); err != nil {
			return fmt.Errorf("body is not JSON: %w", err)
		}
	}
	return s.Validate(v)
}

// Client returns a copy of c (nil: http.DefaultClient) whose transport
// validates every request and answer against the OpenAPI document (see
// Transport). It is safe for concurrent use.
func Client(c *http.Client) *http.Client {
	if c == nil {
		c = http.DefaultClient
	}
	out := *c
	out.Transport = Transport(c.Transport)
	return &out
}

// Transport returns a RoundTripper that sends through next (nil:
// http.DefaultTransport) and validates every request and answer against
// the OpenAPI document. A mismatch is the RoundTrip's error, so callers on
// other goroutines report it as any failed request. It is safe for
// concurrent use.
func Transport(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return validating{next: next}
}

// validating is the RoundTripper of Transport. A request the document
// calls invalid must be refused (400, 401 or 413); every answer must be
// one the document lists for the route, in the shape it gives; a path or
// method that is no route must get the document's 404 or 405.
type validating struct{ next http.RoundTripper }

func (v validating) RoundTrip(req *http.Request) (*http.Response, error) {
	api, err := apiDoc()
	if err != nil {
		return nil, err
	}
	var body []byte
	if req.Body != nil {
		body, err = io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, err
		}
	}
	send := req.Clone(req.Context())
	check := req.Clone(req.Context())
	if req.Body != nil {
		send.Body = io.NopCloser(bytes.NewReader(body))
		check.Body = io.NopCloser(bytes.NewReader(body))
	}
	if len(body) > 0 && check.Header.Get("Content-Type") == "" {
		// The service reads every body as JSON, whatever its Content-Type.
		check.Header.Set("Content-Type", "application/json")
	}
	route, params, routeErr := api.router.FindRoute(check)
	var (
		input  *openapi3filter.RequestValidationInput
		reqErr error
	)
	if routeErr == nil {
		input = &openapi3filter.RequestValidationInput{
			Request: check, PathParams: params, Route: route,
			Options: &openapi3filter.Options{
				AuthenticationFunc: keyPresent, IncludeResponseStatus: true,
				ExcludeRequestBody: true, ExcludeResponseBody: true,
			},
		}
		reqErr = errors.Join(openapi3filter.ValidateRequest(req.Context(), input), api.checkRequestBody(route, check, body))
	}
	resp, err := v.next.RoundTrip(send)
	if err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(raw))
	if err := api.check(input, routeErr, reqErr, resp, raw); err != nil {
		return nil, fmt.Errorf("openapi: %s %s answered %d: %w", req.Method, req.URL.Path, resp.StatusCode, err)
	}
	return resp, nil
}

// checkRequestBody validates a request's body against its operation's.
func (a *openAPI) checkRequestBody(route *routers.Route, req *http.Request, body []byte) error {
	rb := route.Operation.RequestBody
	switch {
	case rb == nil:
		return nil
	case len(body) == 0 && rb.Value.Required:
		return errors.New("request body: required")
	case len(body) == 0:
		return nil
	}
	at := pointer("paths", route.Path, strings.ToLower(req.Method), "requestBody")
	if err := a.checkBody(rb.Value.Content, at, req.Header.Get("Content-Type"), body); err != nil {
		return fmt.Errorf("request body: %w", err)
	}
	return nil
}

// keyPresent passes a request that carries the scheme's header: whether
// the key is right is the service's to say (401), not the document's.
func keyPresent(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	if in.RequestValidationInput.Request.Header.Get(in.SecurityScheme.Name) == "" {
		return in.NewError(fmt.Errorf("no %s header", in.SecurityScheme.Name))
	}
	return nil
}

// check validates one answer; see validating.
func (a *openAPI) check(input *openapi3filter.RequestValidationInput, routeErr, reqErr error, resp *http.Response, raw []byte) error {
	if routeErr != nil {
		return a.checkNoRoute(routeErr, resp, raw)
	}
	if reqErr != nil && !slices.Contains([]int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusRequestEntityTooLarge}, resp.StatusCode) {
		return fmt.Errorf("the document calls the request invalid, the service did not refuse it: %w", reqErr)
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: input, Status: resp.StatusCode, Header: resp.Header,
		Options: input.Options,
	}
	out.SetBodyBytes(raw)
	if err := openapi3filter.ValidateResponse(input.Request.Context(), out); err != nil {
		return err
	}
	// The status is documented (ValidateResponse checked that): its body.
	code := strconv.Itoa(resp.StatusCode)
	ref := input.Route.Operation.Responses.Value(code)
	if ref == nil {
		return fmt.Errorf("status %s is not documented for this route", code)
	}
	at := pointer("paths", input.Route.Path, strings.ToLower(input.Request.Method), "responses", code)
	if ref.Ref != "" {
		at = strings.TrimPrefix(ref.Ref, "#")
	}
	if err := a.checkBody(ref.Value.Content, at, resp.Header.Get("Content-Type"), raw); err != nil {
		return fmt.Errorf("response body: %w", err)
	}
	return nil
}

// checkNoRoute wants the document's NotFound or MethodNotAllowed answer.
func (a *openAPI) checkNoRoute(routeErr error, resp *http.Response, raw []byte) error {
	name, status := "NotFound", http.StatusNotFound
	if errors.Is(routeErr, routers.ErrMethodNotAllowed) {
		name, status = "MethodNotAllowed", http.StatusMethodNotAllowed
	}
	if resp.StatusCode != status {
		return fmt.Errorf("no route in the document (%w), yet not %d", routeErr, status)
	}
	return a.checkBody(a.doc.Components.Responses[name].Value.Content, pointer("components", "responses", name), resp.Header.Get("Content-Type"), raw)
}
