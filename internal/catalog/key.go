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

// redacted replaces a secret wherever it would be printed.
const redacted = "[redacted]"

// Secret is a credential's secret. It prints, logs and marshals as
// "[redacted]"; Reveal is the one way to read it.
type Secret string

// Format covers every fmt verb: without it a verb that does not fit a
// string (%d) makes fmt print the raw value.
func (Secret) Format(f fmt.State, _ rune)   { _, _ = io.WriteString(f, redacted) }
func (Secret) String() string               { return redacted }
func (Secret) GoString() string             { return redacted }
func (Secret) LogValue() slog.Value         { return slog.StringValue(redacted) }
func (Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }
func (Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }
func (s Secret) Reveal() string             { return string(s) }

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
	// SyncedAt is when the key first reached the lease store (MarkSynced);
	// zero if it never did. A key the store lacks although it had it means
	// the store lost state.
	SyncedAt time.Time
}

// Supports reports whether the key serves the canonical model.
func (k Key) Supports(model string) bool { return slices.Contains(k.Models, model) }

// LeaseState is the key's allocation state for the lease store: no secret,
// no models, no counters.
func (k Key) LeaseState() optimistic.KeyState {
	return optimistic.KeyState{
		ID: k.ID, Provider: k.Provider, Pool: k.Pool, Status: k.Status,
		CooldownUntil: k.CooldownUntil, MaxConcurrentUses: k.MaxConcurrentUses,
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
// same rule the lease stores apply, see optimistic.Usable).
func (k Key) Usable(now time.Time) bool {
	switch k.Status {
	case optimistic.StatusAvailable:
		return true
	case optimistic.StatusRateLimited, optimistic.StatusCooldown:
		return !k.CooldownUntil.IsZero() && !k.CooldownUntil.After(now)
	}
	return false
}
