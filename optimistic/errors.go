package optimistic

import (
	"errors"
	"fmt"
	"time"
)

// The outcomes of the lease store contract. Every LeaseStore implementation
// returns these, so callers and the conformance suite check them with
// errors.Is whatever the backend.
var (
	// ErrNoCapacity means no candidate had a free slot right now. It is a
	// normal result, not a failure; the error is a *CapacityError that says
	// when something may free up.
	ErrNoCapacity = errors.New("optimistic: no free slot in candidates")

	// ErrContended means the retry budget ran out while other allocators kept
	// changing the candidates under us. Nothing was written.
	ErrContended = errors.New("optimistic: gave up after repeated transaction conflicts")

	// ErrStore wraps a failure of the backing store (network, server, pool
	// timeout). The operation may or may not have been applied; leases it
	// may have written expire by themselves.
	ErrStore = errors.New("optimistic: store unavailable")

	// ErrLeaseLost means the lease is unknown, released, or expired (and may
	// have been pruned). A lost lease is never recreated: the holder must stop
	// using the credential.
	ErrLeaseLost = errors.New("optimistic: lease lost")

	// ErrLeaseMismatch means the lease exists but belongs to another key,
	// provider or pool; it was left untouched. It wraps ErrLeaseLost, so a
	// caller that only asks "do I still hold it?" checks ErrLeaseLost alone.
	ErrLeaseMismatch = fmt.Errorf("%w: it belongs to another key, provider or pool", ErrLeaseLost)

	// ErrRequestInFlight means another allocate with the same request id
	// has not finished yet; retry shortly to get its lease.
	ErrRequestInFlight = errors.New("optimistic: a request with this id is still in flight")

	// ErrInvalid means the request was rejected before touching the store:
	// a malformed id, a non-positive ttl, an unknown status.
	ErrInvalid = errors.New("optimistic: invalid argument")
)

// CapacityError is the ErrNoCapacity result of Allocate.
type CapacityError struct {
	// FreeAt is the earliest moment, by the store's clock, at which a lease
	// of a skipped candidate expires or its cooldown ends. Zero means none of
	// the candidates frees up by itself (all missing, disabled, or similar).
	FreeAt time.Time
}

func (e *CapacityError) Error() string {
	if e.FreeAt.IsZero() {
		return ErrNoCapacity.Error()
	}
	return fmt.Sprintf("%s (earliest free at %s)", ErrNoCapacity, e.FreeAt.UTC().Format(time.RFC3339Nano))
}

func (e *CapacityError) Unwrap() error { return ErrNoCapacity }

// StoreError wraps err from the backing store so that errors.Is finds both
// ErrStore and the original cause.
func StoreError(op string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrStore, op, err)
}

// invalidf returns an ErrInvalid with a message naming the offending value.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}
