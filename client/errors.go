package client

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Errors the service answers, one per error code; an *Error unwraps to
// the one of its code. Check with errors.Is, and with errors.As for the
// *Error (its RetryAfter, its Field).
var (
	// ErrPoolExhausted (429 pool_exhausted): every key that serves the
	// model is full or cooling down. Wait the *Error's RetryAfter (zero:
	// nothing frees up by itself), or try another pool.
	ErrPoolExhausted = errors.New("client: pool exhausted")
	// ErrContended (429 contended): the service's conflict retries ran
	// out on a hot key. Retry after a short jittered pause.
	ErrContended = errors.New("client: contended")
	// ErrNoCandidates (404 no_candidates): the provider has no keys in the
	// pool or its fallbacks. Do not retry.
	ErrNoCandidates = errors.New("client: no candidates")
	// ErrPolicyConflict (409 policy_conflict): keys exist but none serves
	// the model. Do not retry.
	ErrPolicyConflict = errors.New("client: policy conflict")
	// ErrRequestInFlight (409 request_in_flight): another allocate with
	// the same request id is still being served; retrying gets its lease.
	ErrRequestInFlight = errors.New("client: request in flight")
	// ErrRequestIDReused (409 request_id_reused): the request id was used
	// for another pool or model.
	ErrRequestIDReused = errors.New("client: request id reused")
	// ErrLeaseLost (410 lease_lost, or a Release or Report the service
	// answered "not_found_or_expired"): the lease expired, was released,
	// or its key was disabled, deleted or moved. Stop using the
	// credential now.
	ErrLeaseLost = errors.New("client: lease lost")
	// ErrLeaseMismatch (a Release or Report answered "owner_mismatch", or
	// 409 owner_mismatch to a Renew): the lease belongs to another
	// provider or pool than the one named and was left alone; name the
	// pool it was granted from (Lease.Pool). It also matches ErrLeaseLost.
	ErrLeaseMismatch = fmt.Errorf("%w: owned by another provider or pool", ErrLeaseLost)
	// ErrStoreUnavailable (503 store_unavailable): the lease store failed.
	// Retry later; never read it as "full".
	ErrStoreUnavailable = errors.New("client: lease store unavailable")
	// ErrCatalogUnavailable (503 catalog_unavailable): the key catalog
	// failed. Retry later.
	ErrCatalogUnavailable = errors.New("client: catalog unavailable")
	// ErrTimeout (503 timeout): the request ran out of the service's
	// deadline. Retry.
	ErrTimeout = errors.New("client: service timed out")
	// ErrShuttingDown (503 shutting_down): the allocate waited for a slot
	// (Wait) and the instance began to shut down before one freed up; it
	// holds no slot. Retry, which reaches another instance behind a load
	// balancer.
	ErrShuttingDown = errors.New("client: service shutting down")
	// ErrInvalidRequest (400 invalid_request, 413 body_too_large): fix the
	// request; the *Error's Field names the field at fault.
	ErrInvalidRequest = errors.New("client: invalid request")
	// ErrUnauthorized (401 unauthorized): a missing or wrong key.
	ErrUnauthorized = errors.New("client: unauthorized")
	// ErrKeyNotFound (404 key_not_found): admin, no key has that id.
	ErrKeyNotFound = errors.New("client: key not found")
	// ErrAliasNotFound (404 alias_not_found): admin, the provider has no
	// such alias.
	ErrAliasNotFound = errors.New("client: alias not found")
	// ErrUnreachable: no answer came back while the caller's ctx was still
	// live: the connection could not be made (nothing was sent), or
	// ErrOutcomeUnknown, which matches it too. Retry either.
	ErrUnreachable = errors.New("client: service unreachable")
	// ErrOutcomeUnknown: the request went out and no answer came back (the
	// connection was cut, the client's Timeout or ctx ended first), or a
	// proxy in between answered 502, 503 or 504 in its own words: a write
	// may or may not have been applied; read it back to know. While ctx
	// is live it also matches ErrUnreachable; once ctx is done, ctx's
	// error instead.
	ErrOutcomeUnknown = errors.New("client: no answer to a request sent: outcome unknown")
	// ErrNotReported wraps the error of Hold's final report: the outcome
	// was not recorded (the lease then expires by itself). The work itself
	// may have succeeded.
	ErrNotReported = errors.New("client: outcome not reported")
)

// codes maps the service's error codes to the errors above. Codes not in
// it (not_found, method_not_allowed, client_closed_request, internal) are
// an *Error that unwraps to nothing.
var codes = map[string]error{
	"pool_exhausted":      ErrPoolExhausted,
	"contended":           ErrContended,
	"no_candidates":       ErrNoCandidates,
	"policy_conflict":     ErrPolicyConflict,
	"request_in_flight":   ErrRequestInFlight,
	"request_id_reused":   ErrRequestIDReused,
	"lease_lost":          ErrLeaseLost,
	"owner_mismatch":      ErrLeaseMismatch,
	"store_unavailable":   ErrStoreUnavailable,
	"catalog_unavailable": ErrCatalogUnavailable,
	"timeout":             ErrTimeout,
	"shutting_down":       ErrShuttingDown,
	"invalid_request":     ErrInvalidRequest,
	"body_too_large":      ErrInvalidRequest,
	"unauthorized":        ErrUnauthorized,
	"key_not_found":       ErrKeyNotFound,
	"alias_not_found":     ErrAliasNotFound,
}

// Error is an error answer of the service: its status, code and message.
type Error struct {
	// StatusCode is the HTTP status, e.g. 429.
	StatusCode int
	// Code is the service's error code, e.g. "pool_exhausted"; empty if
	// the answer was not the service's JSON error.
	Code    string
	Message string
	// Field names the request field at fault (400 only).
	Field string
	// RetryAfter is the answer's Retry-After; zero when it had none (a
	// pool_exhausted without one frees up by no one's release).
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	code := e.Code
	if code == "" {
		code = http.StatusText(e.StatusCode)
	}
	if e.Message == "" {
		return fmt.Sprintf("client: %d %s", e.StatusCode, code)
	}
	return fmt.Sprintf("client: %d %s: %s", e.StatusCode, code, e.Message)
}

// Unwrap returns the sentinel of the code (ErrPoolExhausted, …), if any.
// A 502, 503 or 504 without the service's code is a proxy's or load
// balancer's: the request may or may not have reached the service, as
// with no answer at all, so it is ErrOutcomeUnknown and ErrUnreachable.
func (e *Error) Unwrap() error {
	if e.Code == "" {
		switch e.StatusCode {
		case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return unanswered{ErrOutcomeUnknown}
		}
	}
	return codes[e.Code]
}

// unanswered is a request that went out and got no answer while the
// caller's ctx was live: it reads as its error, and matches
// ErrUnreachable too (retry it) without saying "unreachable", which
// would claim nothing got through.
type unanswered struct{ error }

func (e unanswered) Unwrap() []error { return []error{e.error, ErrUnreachable} }
