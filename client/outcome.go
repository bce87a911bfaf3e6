package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// UpstreamError is an upstream's refusal of a call made with a leased
// credential. Returned (or wrapped) by Hold's work, it decides the report:
// 429 is RateLimited with RetryAfter as the cooldown, 401 and 403 are
// AuthError (the key is disabled), anything else is Failure.
type UpstreamError struct {
	StatusCode int
	// RetryAfter is the upstream's Retry-After, at most a day (the
	// longest cooldown the service takes); zero if it sent none.
	RetryAfter time.Duration
	// Err is the cause, if any.
	Err error
}

func (e *UpstreamError) Error() string {
	msg := fmt.Sprintf("client: upstream answered %d", e.StatusCode)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *UpstreamError) Unwrap() error { return e.Err }

// Outcome is what Hold reports for e, and the cooldown of RateLimited.
func (e *UpstreamError) Outcome() (Outcome, time.Duration) {
	switch e.StatusCode {
	case http.StatusTooManyRequests:
		return RateLimited, e.RetryAfter
	case http.StatusUnauthorized, http.StatusForbidden:
		return AuthError, 0
	}
	return Failure, 0
}

// CheckResponse returns nil for an upstream answer below 400, else an
// *UpstreamError with its status and Retry-After (seconds or an HTTP
// date). It reads only the status and headers, never the body.
func CheckResponse(resp *http.Response) error {
	if resp.StatusCode < 400 {
		return nil
	}
	return &UpstreamError{StatusCode: resp.StatusCode, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
}

// parseRetryAfter reads a Retry-After header: whole seconds or an HTTP
// date; zero if absent, malformed or past. Past a day is a day, the
// longest cooldown the service takes (more seconds would overflow a
// Duration).
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		return time.Duration(min(max(s, 0), int64(maxRetryAfter/time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), maxRetryAfter)
	}
	return 0
}

// OutcomeOf is the report Hold sends when its work returned err: nil is
// Success; an *UpstreamError in err's chain decides by its status (see
// UpstreamError); context.Canceled (the work was abandoned, which says
// nothing about the key) is "" and the lease is released without a
// report; anything else is Failure. The duration is RateLimited's
// cooldown.
func OutcomeOf(err error) (Outcome, time.Duration) {
	var up *UpstreamError
	switch {
	case err == nil:
		return Success, 0
	case errors.As(err, &up):
		return up.Outcome()
	case errors.Is(err, context.Canceled):
		return "", 0
	}
	return Failure, 0
}
