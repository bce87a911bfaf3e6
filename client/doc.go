// Package client is a Go client of credpool's HTTP API.
//
// Client leases credentials: Allocate, Renew, Release and Report, and Hold,
// which does all of it around a function: it allocates, renews in the
// background, cancels the function's context the moment the lease is
// lost, and reports the outcome (which releases the lease) on every return
// path, panics included. Admin manages keys and aliases.
//
// Every error answer is an *Error that unwraps to one sentinel per error
// code (ErrPoolExhausted, ErrLeaseLost, …), so callers decide with
// errors.Is and read Retry-After with errors.As. The credential is a Secret
// that prints, logs and marshals as "[redacted]".
//
// The package depends on the standard library only.
package client
