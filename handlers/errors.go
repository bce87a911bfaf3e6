package handlers

import (
	"context"
	"errors"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/requestlog"
	"github.com/credpool/credpool/optimistic"
)

// errorBody is every error response: {"error":{"code":…,"message":…}}.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Field names the offending request field of a 400.
	Field string `json:"field,omitempty"`
}

// errorCodes is the one mapping from outcomes to HTTP, tried in order: a
// cancelled request is not a store failure, a busy or broken catalog
// wraps the store's outcomes, and "full" (429) must never be confused
// with "store down" (503): callers back off on one and alert on the other.
var errorCodes = []struct {
	err    error
	status int
	code   string
}{
	{context.Canceled, 499, "client_closed_request"},
	{context.DeadlineExceeded, http.StatusServiceUnavailable, "timeout"},
	// Not "full": this instance stops; another may have a slot.
	{broker.ErrShuttingDown, http.StatusServiceUnavailable, "shutting_down"},
	{optimistic.ErrInvalid, http.StatusBadRequest, "invalid_request"},
	{broker.ErrCatalog, http.StatusServiceUnavailable, "catalog_unavailable"},
	{broker.ErrNoCandidates, http.StatusNotFound, "no_candidates"},
	{catalog.ErrNotFound, http.StatusNotFound, "key_not_found"},
	{catalog.ErrAliasNotFound, http.StatusNotFound, "alias_not_found"},
	{broker.ErrPolicy, http.StatusConflict, "policy_conflict"},
	{requestlog.ErrInFlight, http.StatusConflict, "request_in_flight"},
	{requestlog.ErrReused, http.StatusConflict, "request_id_reused"},
	{optimistic.ErrNoCapacity, http.StatusTooManyRequests, "pool_exhausted"},
	{optimistic.ErrContended, http.StatusTooManyRequests, "contended"},
	// Before ErrLeaseLost, which it wraps: the lease is still held, by
	// the provider and pool it was granted to, not the ones named.
	{optimistic.ErrLeaseMismatch, http.StatusConflict, "owner_mismatch"},
	{optimistic.ErrLeaseLost, http.StatusGone, "lease_lost"},
	{optimistic.ErrStore, http.StatusServiceUnavailable, "store_unavailable"},
}

// statusFor maps err by errorCodes; anything else is 500 internal.
func statusFor(err error) (status int, code string) {
	for _, e := range errorCodes {
		if errors.Is(err, e.err) {
			return e.status, e.code
		}
	}
	return http.StatusInternalServerError, "internal"
}

// fail writes an error response.
func fail(c *gin.Context, status int, code, message, field string) {
	c.Set("error_code", code)
	c.JSON(status, errorBody{Error: errorDetail{Code: code, Message: message, Field: field}})
}

// serverFault are the messages of answers that blame the server. The
// error behind one is logged, never sent: it can name an address, a file
// or a driver's view of the request.
var serverFault = map[string]string{
	"store_unavailable":   "the lease store is unavailable; retry later",
	"catalog_unavailable": "the key catalog is unavailable; retry later",
	"timeout":             "the request ran out of time; retry",
	"shutting_down":       "this instance is shutting down and waits for no slot; retry on another",
	"internal":            "internal error",
}

// failErr writes err as its mapped status. A 429 carries Retry-After when
// the wait is known: the seconds until the earliest lease expiry or
// cooldown end, or 1 after contention; shutting_down carries 1 (another
// instance may answer at once). Server faults answer a fixed message and
// leave the error for the request log; other answers carry err's text
// without its Go package prefixes (see clientMessage).
func failErr(c *gin.Context, err error) {
	status, code := statusFor(err)
	msg := clientMessage(err)
	if fixed, ok := serverFault[code]; ok {
		c.Set(logError, err.Error())
		msg = fixed
	}
	if status == http.StatusTooManyRequests || code == "shutting_down" {
		if s, ok := retryAfter(err, time.Now()); ok {
			c.Header("Retry-After", strconv.Itoa(s))
		}
	}
	fail(c, status, code, msg, "")
}

// goPrefix is the name of one of the service's packages that starts an
// error's text or a part of it ("optimistic: no free slot…", "…: broker:
// …"): the logs' way to say where an error came from, not the client's.
// Ids, pools and models hold no spaces, so a value quoted in an error
// cannot end in ": " and look like one.
var goPrefix = regexp.MustCompile(`(^|: )(?:optimistic|broker|catalog|requestlog): `)

// clientMessage is err's text as an answer's message: without the package
// prefixes its parts carry (goPrefix).
func clientMessage(err error) string {
	return goPrefix.ReplaceAllString(err.Error(), "$1")
}

// retryAfter is whole seconds from now until err says to try again, at
// least 1; false when nothing frees up by itself (e.g. all keys disabled).
// A pool full of held leases says 1: holders release whenever they are
// done, usually long before their leases end, so the lease's end would
// keep callers waiting for slots that are free. A cooldown's end is exact.
func retryAfter(err error, now time.Time) (int, bool) {
	var full *optimistic.CapacityError
	if errors.As(err, &full) {
		if full.FreeAt.IsZero() {
			return 0, false
		}
		secs := max(1, int(math.Ceil(full.FreeAt.Sub(now).Seconds())))
		if full.Held {
			secs = 1
		}
		return secs, true
	}
	return 1, true
}
