// Package catalog is the source of truth for credentials: ids, pools,
// models, secrets, aliases, health and counters, in SQL. Secrets live only
// here: the lease store gets a key's allocation state (Key.LeaseState),
// never its secret, and only Get reads one.
package catalog

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"github.com/credpool/credpool/optimistic"
)

// ErrNotFound means no key has that id.
var ErrNotFound = errors.New("catalog: key not found")

// ErrSecret means a key's secret does not open with the sealing keys this
// process has: the key itself is fine, but cannot be handed out here.
var ErrSecret = errors.New("catalog: secret does not open")

// ErrWrongKey means the catalog holds sealed secrets and none was sealed
// with a key this process has: it was given the wrong key.
var ErrWrongKey = errors.New("catalog: the secret key does not open the catalog's secrets")

// redacted replaces a secret wherever it would be printed.
const redacted = "[redacted]"

// Secret is a credential's secret. It prints, logs and marshals as
// "[redacted]"; Reveal is the one way to read it.
type Secret string

// Format covers every fmt verb: without it a verb that does not fit a
// string (%d) makes fmt print the raw value.
func (Secret) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, redacted) }

// String redacts the secret (fmt's %s and %v).
func (Secret) String() string { return redacted }

// GoString redacts the secret (fmt's %#v).
func (Secret) GoString() string { return redacted }

// LogValue redacts the secret in slog.
func (Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalJSON redacts the secret in JSON.
func (Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }

// MarshalText redacts the secret wherever text encoding is used.
func (Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// Reveal returns the secret itself: the one way to read it.
func (s Secret) Reveal() string { return string(s) }

// Key is one credential as the catalog stores it.
type Key struct {
	ID       string
	Provider string
	Pool     string
	// Models are the canonical model ids the key serves.
	Models []string
	Secret Secret
	Status optimistic.Status
	// CooldownUntil is when a rate_limited or cooldown key may be used
	// again; zero means not set.
	CooldownUntil     time.Time
	MaxConcurrentUses int
	LastUsedAt        time.Time
	LastVerifiedAt    time.Time
	Successes         int64
	Errors            int64
	RateLimitHits     int64
	CreatedAt         time.Time
	UpdatedAt         time.Time
	// SyncedAt is when the key first reached the lease store SyncedStore
	// names (MarkSynced); zero if it never did. A key that store lacks
	// although it had it means the store lost state.
	SyncedAt    time.Time
	SyncedStore string
	// QuarantineUntil is when a key the lease store lost may take leases
	// again (Quarantine): leases the store forgot may be in use until then.
	// It holds whatever the status says, and Put leaves it alone.
	QuarantineUntil time.Time
}

// Supports reports whether the key serves the canonical model.
func (k Key) Supports(model string) bool { return slices.Contains(k.Models, model) }

// LeaseState is the key's allocation state for the lease store: no secret,
// no models, no counters. A quarantine shows as a cooldown that ends no
// earlier than it: the store then grants nothing before it either.
func (k Key) LeaseState() optimistic.KeyState {
	status, cooldown := k.Status, k.CooldownUntil
	if !k.QuarantineUntil.IsZero() {
		switch {
		case status == optimistic.StatusAvailable:
			status, cooldown = optimistic.StatusCooldown, k.QuarantineUntil
		case (status == optimistic.StatusRateLimited || status == optimistic.StatusCooldown) &&
			!cooldown.IsZero() && k.QuarantineUntil.After(cooldown):
			cooldown = k.QuarantineUntil
		}
	}
	return optimistic.KeyState{
		ID: k.ID, Provider: k.Provider, Pool: k.Pool, Status: status,
		CooldownUntil: cooldown, MaxConcurrentUses: k.MaxConcurrentUses,
		LastUsedAt: k.LastUsedAt,
	}
}

// Outcome is what a caller reports about one use of a key.
type Outcome string

// The outcomes a caller can report.
const (
	OutcomeSuccess     Outcome = "success"
	OutcomeError       Outcome = "error"
	OutcomeRateLimited Outcome = "rate_limited"
	OutcomeAuthError   Outcome = "auth_error"
)

// Valid reports whether o is a known outcome.
func (o Outcome) Valid() bool {
	switch o {
	case OutcomeSuccess, OutcomeError, OutcomeRateLimited, OutcomeAuthError:
		return true
	}
	return false
}

// Usable reports whether the catalog lets the key take a lease at now:
// available, or rate_limited/cooldown with a cooldown that has passed (the
// same rule the lease stores apply, see optimistic.Usable), and out of any
// quarantine.
func (k Key) Usable(now time.Time) bool {
	if k.QuarantineUntil.After(now) {
		return false
	}
	switch k.Status {
	case optimistic.StatusAvailable:
		return true
	case optimistic.StatusRateLimited, optimistic.StatusCooldown:
		return !k.CooldownUntil.IsZero() && !k.CooldownUntil.After(now)
	}
	return false
}

// UsableAt is when a key not usable now becomes usable by itself: the end
// of its cooldown or quarantine, whichever is later; zero if never by
// itself (disabled, pending, exhausted, or cooling with no end).
func (k Key) UsableAt() time.Time {
	at := k.QuarantineUntil
	switch k.Status {
	case optimistic.StatusAvailable:
	case optimistic.StatusRateLimited, optimistic.StatusCooldown:
		if k.CooldownUntil.IsZero() {
			return time.Time{}
		}
		if k.CooldownUntil.After(at) {
			at = k.CooldownUntil
		}
	default:
		return time.Time{}
	}
	return at
}
