package optimistic

import (
	"context"
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

	// ErrConflict marks one attempt that lost a race and wrote nothing: an
	// aborted EXEC on Redis, a busy or locked file on SQLite. Stores retry
	// it themselves and map their own kind of conflict to it, so the retry
	// loop and Classify need to know no backend's types; one that outlives
	// the retries reaches the caller as ErrContended.
	ErrConflict = errors.New("optimistic: transaction conflict")

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

	// ErrUnreachable marks a store failure limited to some keys: the
	// server holding them did not answer, or refused writes for now (on
	// Redis Cluster, a master that is down, or read-only, out of memory,
	// short of replicas, while the others take writes). It comes wrapped
	// in ErrStore; a caller that can do without those keys (try others,
	// sync the rest) tells it apart with errors.Is.
	ErrUnreachable = errors.New("optimistic: a server holding the key did not answer or took no write")

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
	// Held says FreeAt is when a held lease ends. Holders usually release
	// well before, so a slot may free up at any moment: retry soon. When
	// false, FreeAt is a cooldown's end, which nothing brings forward.
	Held bool
}

// Error says no slot was free, and when one may free up if known.
func (e *CapacityError) Error() string {
	if e.FreeAt.IsZero() {
		return ErrNoCapacity.Error()
	}
	return fmt.Sprintf("%s (earliest free at %s)", ErrNoCapacity, e.FreeAt.UTC().Format(time.RFC3339Nano))
}

// Unwrap makes errors.Is(err, ErrNoCapacity) hold.
func (e *CapacityError) Unwrap() error { return ErrNoCapacity }

// Merge folds one more skipped candidate into e, as a store builds its
// CapacityError: at is when that candidate frees up (zero: never by
// itself) and held whether a held lease ends then (see FreeAt). e keeps the
// earliest at; on a tie, Held if either says so.
func (e *CapacityError) Merge(at time.Time, held bool) {
	if at.IsZero() || (!e.FreeAt.IsZero() && at.After(e.FreeAt)) {
		return
	}
	e.Held = held || (at.Equal(e.FreeAt) && e.Held)
	e.FreeAt = at
}

// Loss says why a lease id holds no lease: the reasons NotHeld words.
type Loss string

// The reasons a store finds for a lease ref that holds no lease. Their
// values are the replies of the Lua baseline's scripts.
const (
	// LostUnknown: never granted, released, pruned, or looked up under
	// another key id (a lease's record lives under its key).
	LostUnknown Loss = "unknown"
	// LostMismatch: granted for another provider or pool.
	LostMismatch Loss = "mismatch"
	// LostExpired: granted, but its expiry has passed.
	LostExpired Loss = "expired"
)

// NotHeld returns the contract's error for leaseID holding no lease, as
// every store words it: ErrLeaseMismatch for LostMismatch, else
// ErrLeaseLost.
func NotHeld(leaseID string, why Loss) error {
	switch why {
	case LostMismatch:
		return fmt.Errorf("%w: lease %s", ErrLeaseMismatch, leaseID)
	case LostExpired:
		return fmt.Errorf("%w: lease %s expired", ErrLeaseLost, leaseID)
	}
	return fmt.Errorf("%w: lease %s is unknown, released or expired", ErrLeaseLost, leaseID)
}

// Classify turns what a store operation returned into the contract's
// errors: the contract's own outcomes pass through, cancellation keeps
// both causes (and is never ErrStore), a conflict (ErrConflict) that
// outlived the retries is ErrContended, and anything else is ErrStore
// wrapping the cause. Every LeaseStore implementation ends its methods
// with it, so their errors agree.
func Classify(ctx context.Context, op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNoCapacity), errors.Is(err, ErrLeaseLost), errors.Is(err, ErrInvalid),
		errors.Is(err, ErrContended):
		return err
	case ctx.Err() != nil:
		if errors.Is(err, ctx.Err()) {
			return fmt.Errorf("optimistic: %s: %w", op, err)
		}
		return errors.Join(fmt.Errorf("optimistic: %s: %w", op, err), ctx.Err())
	case errors.Is(err, ErrConflict):
		return fmt.Errorf("%w: %s: %w", ErrContended, op, err)
	}
	return fmt.Errorf("%w: %s: %w", ErrStore, op, err)
}

// invalidf returns an ErrInvalid with a message naming the offending value.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}
