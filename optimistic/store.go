package optimistic

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// LeaseStore is the lease store contract of DESIGN.md. The WATCH/MULTI Store
// here, the Lua baseline in bench/ and the SQLite store all implement it and
// all pass the conformance suite in test/.
type LeaseStore interface {
	// Allocate leases a slot on the first candidate, in the given order, that
	// belongs to the provider/pool, is usable and has a free slot. The
	// returned Stats are valid whatever the error.
	Allocate(ctx context.Context, req AllocateRequest) (Lease, Stats, error)
	// Release deletes the lease if all four ids match; otherwise it returns
	// an error wrapping ErrLeaseLost and touches nothing.
	Release(ctx context.Context, ref LeaseRef) error
	// Renew extends a live lease to now+ttl and returns the new expiry.
	Renew(ctx context.Context, ref LeaseRef, ttl time.Duration) (time.Time, error)
	// SyncKey upserts a key's allocation state and pool membership.
	SyncKey(ctx context.Context, k Key) error
	// DeleteKey removes the key, its leases and its pool membership.
	DeleteKey(ctx context.Context, keyID string) error
	// ClearLeases force-releases every lease of the key and says how many.
	ClearLeases(ctx context.Context, keyID string) (int, error)
	// Inspect reports the live state of each key, in the order given.
	Inspect(ctx context.Context, keyIDs ...string) ([]KeyInfo, error)
}

var _ LeaseStore = (*Store)(nil)

// Status is a key's health as the catalog sees it. Leases never change it,
// except that a grant after a passed cooldown sets it back to available.
type Status string

// The statuses a key can have. Only available keys, and rate_limited or
// cooldown keys whose cooldown has passed, take leases.
const (
	StatusAvailable   Status = "available"
	StatusPending     Status = "pending"
	StatusDisabled    Status = "disabled"
	StatusExhausted   Status = "exhausted"
	StatusRateLimited Status = "rate_limited"
	StatusCooldown    Status = "cooldown"
)

// Valid reports whether s is one of the known statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusAvailable, StatusPending, StatusDisabled, StatusExhausted, StatusRateLimited, StatusCooldown:
		return true
	}
	return false
}

// AllocateRequest asks for one lease.
type AllocateRequest struct {
	Provider string
	Pool     string
	// Candidates are key ids, best first. Ids that are not members of
	// Provider/Pool are skipped and never get a lease written.
	Candidates []string
	// TTL is the lease length, at least one millisecond.
	TTL time.Duration
}

// LeaseRef names a lease: release and renew succeed only if all four match.
type LeaseRef struct {
	Provider string
	Pool     string
	KeyID    string
	LeaseID  string
}

// Lease is a granted slot.
type Lease struct {
	LeaseRef
	// Until is the expiry by the store's clock; after it the slot returns
	// to the pool by itself.
	Until time.Time
	// Fence increases with every grant on the key, so a downstream system
	// can reject a stale holder. It restarts at 1 if the key is deleted.
	Fence int64
}

// Stats counts the work one Allocate did.
type Stats struct {
	// Attempts is the number of read-decide rounds over all candidates
	// (for SQLite: transactions, each covering every candidate).
	Attempts int
	// Conflicts is the number of rounds whose commit was aborted because
	// another allocator changed the candidate first (for SQLite: rounds
	// retried because the file was busy).
	Conflicts int
	// Pruned counts expired leases this call removed: leases whose holders
	// never released them.
	Pruned int
}

// Key is a credential's allocation state, as the catalog knows it.
type Key struct {
	ID       string
	Provider string
	Pool     string
	Status   Status
	// CooldownUntil is when a rate_limited or cooldown key may be used
	// again; zero means not set, which keeps such a key unusable.
	CooldownUntil time.Time
	// MaxConcurrentUses is the slot limit; below 1 counts as 1.
	MaxConcurrentUses int
	// LastUsedAt is written only when non-zero.
	LastUsedAt time.Time
	// Score is the key's ops score in the pool ZSET; Allocate never reads it.
	Score float64
}

// Validate returns an ErrInvalid naming a malformed id or unknown status.
func (k Key) Validate() error {
	if err := checkIDs("key id", k.ID, "provider", k.Provider, "pool", k.Pool); err != nil {
		return err
	}
	if !k.Status.Valid() {
		return invalidf("status %q of key %s: unknown", k.Status, k.ID)
	}
	return nil
}

// KeyInfo is a key's live state by the store's clock.
type KeyInfo struct {
	ID            string
	Exists        bool
	Provider      string
	Pool          string
	Status        Status
	CooldownUntil time.Time
	// Limit is max_concurrent_uses as Allocate reads it (at least 1).
	Limit int
	// Live counts unexpired leases.
	Live int
	// FreeAt is the earliest moment the key can grant: the store's now if it
	// can grant now, else the end of its cooldown or its first lease expiry,
	// whichever is later. Zero means it never frees up by itself.
	FreeAt time.Time
	// Fence is the last fencing token handed out.
	Fence int64
}

// Options configure a Store. A nil *Options means all defaults.
type Options struct {
	// Prefix starts every Redis key name; it must not contain braces.
	//
	// default: "credpool"
	Prefix string

	// MaxRetries bounds the pauses in one Allocate (or Renew, DeleteKey,
	// ClearLeases) call. Allocate pauses when every candidate left had its
	// commit aborted twice in a row, or after an EXEC whose reply was lost;
	// it then tries those candidates again.
	//
	// default: 10
	MaxRetries int

	// MinBackoff is the first pause; later pauses grow by 2x with ±50%
	// jitter. A short first pause serves a key of several slots; the long
	// tail throttles a herd on one hot key.
	//
	// default: 200µs
	MinBackoff time.Duration

	// MaxBackoff caps one pause.
	//
	// default: 64ms
	MaxBackoff time.Duration

	// MaxElapsed bounds the time one call spends retrying conflicts; it is
	// checked at each pause. Waiting for a key's turn within a pass is
	// bounded by ctx alone.
	//
	// default: 2s
	MaxElapsed time.Duration

	// RecordGrace is how long a lease record outlives its lease before Redis
	// expires it by itself (it is normally deleted earlier, by release or
	// prune).
	//
	// default: 1m
	RecordGrace time.Duration
}

func (o *Options) withDefaults() Options {
	var out Options
	if o != nil {
		out = *o
	}
	if out.Prefix == "" {
		out.Prefix = "credpool"
	}
	if out.MaxRetries <= 0 {
		out.MaxRetries = 10
	}
	if out.MinBackoff <= 0 {
		out.MinBackoff = 200 * time.Microsecond
	}
	if out.MaxBackoff <= 0 {
		out.MaxBackoff = 64 * time.Millisecond
	}
	if out.MaxElapsed <= 0 {
		out.MaxElapsed = 2 * time.Second
	}
	if out.RecordGrace <= 0 {
		out.RecordGrace = time.Minute
	}
	return out
}

// Store is the lease store on Redis WATCH/MULTI. It is safe for concurrent
// use; every in-flight transaction holds one pooled connection, so the
// client's PoolSize bounds concurrent calls and PoolTimeout turns an
// exhausted pool into an ErrStore.
type Store struct {
	rdb  redis.UniversalClient
	opts Options
	keys Schema
	// gates maps every key id the store has touched to a chan struct{} of
	// capacity 1, its turn in this process (see enter): a few dozen bytes
	// per key, kept for the store's life.
	gates sync.Map
}

// New returns a Store over rdb: a standalone, Sentinel (failover) or Cluster
// client.
func New(rdb redis.UniversalClient, opts *Options) (*Store, error) {
	if rdb == nil {
		return nil, errors.New("optimistic: nil redis client")
	}
	o := opts.withDefaults()
	if !validPrefix(o.Prefix) {
		return nil, invalidf("prefix %q must not contain braces", o.Prefix)
	}
	return &Store{rdb: rdb, opts: o, keys: Schema{Prefix: o.Prefix}}, nil
}
