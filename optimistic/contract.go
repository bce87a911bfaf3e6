package optimistic

import (
	"context"
	"time"
)

// LeaseStore is the lease store contract of DESIGN.md. The WATCH/MULTI Store
// here, the Lua baseline in bench/baseline and the SQLite store of
// credpool serve all implement it, and all pass the conformance suite in
// optimistic/leasetest. Implementations are safe for concurrent use.
type LeaseStore interface {
	// Allocate leases a slot on the first candidate, in the given order, that
	// belongs to the provider/pool, is usable and has a free slot. The
	// returned Stats are valid whatever the error.
	Allocate(ctx context.Context, req AllocateRequest) (Lease, Stats, error)
	// Release deletes the lease if all four ids match; otherwise it returns
	// an error wrapping ErrLeaseLost and touches nothing.
	Release(ctx context.Context, ref LeaseRef) error
	// Holds returns the lease's expiry if ref holds a live lease, else what
	// Release would say; it writes nothing.
	Holds(ctx context.Context, ref LeaseRef) (time.Time, error)
	// Renew extends a live lease to now+ttl and returns the new expiry.
	Renew(ctx context.Context, ref LeaseRef, ttl time.Duration) (time.Time, error)
	// SyncKey upserts a key's allocation state and pool membership.
	SyncKey(ctx context.Context, k KeyState) error
	// DeleteKey removes the key, its leases and its pool membership.
	DeleteKey(ctx context.Context, keyID string) error
	// ClearLeases force-releases every lease of the key and says how many.
	ClearLeases(ctx context.Context, keyID string) (int, error)
	// Inspect reports the live state of each key, in the order given.
	Inspect(ctx context.Context, keyIDs ...string) ([]KeyInfo, error)
	// Ping checks that the store answers (every node of a cluster). It
	// reads and writes nothing.
	Ping(ctx context.Context) error
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
	// Wait, when positive, is how long Allocate may wait for a slot to
	// free up instead of answering ErrNoCapacity at once; ctx bounds it
	// too. Callers of one process that found the keys full are served in
	// the order they came (see Queue). A store that is not a Waiter
	// refuses it as invalid.
	Wait time.Duration
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
	// can reject a stale holder; it never goes back, not even after the key
	// was deleted or the store lost it (see NextFence).
	Fence int64
}

// Stats counts the work one Allocate did.
type Stats struct {
	// Attempts is the number of read-decide rounds over all candidates
	// (for SQLite: transactions, each covering every candidate). A call
	// granted in the commit of another call of its process that held the
	// key's turn (see Store.Allocate), told by that call that the key is
	// full (a caller that waits, see WithWaiting), or handed its slot by
	// a release (see Store.Release), made none of its own there.
	Attempts int
	// Conflicts is the number of rounds that lost a race and wrote
	// nothing: an EXEC aborted because another allocator changed the
	// candidate first (for SQLite: a transaction that found the file busy).
	// Most are retried; one that ends the retry budget counts too.
	Conflicts int
	// Pruned counts expired leases this call removed: leases whose holders
	// never released them.
	Pruned int
	// Unreachable counts candidates skipped because the server holding
	// them did not answer or refused the write (on Redis Cluster, a master
	// that is down, or read-only, out of memory, short of replicas, while
	// the others take writes) or, with MinReplicas, too few of its replicas
	// acknowledged the grant. If none of the others granted, the call
	// fails with ErrStore, never ErrNoCapacity: the skipped ones may have
	// room.
	Unreachable int
	// Waited is the time the call spent waiting in line for a slot
	// (AllocateRequest.Wait), not asking the store.
	Waited time.Duration
}

// Add adds o's counts and time waited to st's.
func (st *Stats) Add(o Stats) {
	st.Attempts += o.Attempts
	st.Conflicts += o.Conflicts
	st.Pruned += o.Pruned
	st.Unreachable += o.Unreachable
	st.Waited += o.Waited
}

// KeyState is a credential's allocation state: what SyncKey writes and
// Allocate decides on. It has no secret; the catalog keeps that.
type KeyState struct {
	ID       string
	Provider string
	Pool     string
	Status   Status
	// CooldownUntil is when a rate_limited or cooldown key may be used
	// again; zero means not set, which keeps such a key unusable.
	CooldownUntil time.Time
	// MaxConcurrentUses is the slot limit; below 1 counts as 1.
	MaxConcurrentUses int
	// LastUsedAt seeds the key's last grant time when the store has none
	// (a new key, or one it lost); zero seeds nothing. It never replaces
	// the store's own, so a sync from an older catalog read cannot move
	// it back.
	LastUsedAt time.Time
	// Score is the key's ops score in the pool ZSET; Allocate never reads it.
	Score float64
}

// Validate returns an ErrInvalid naming a malformed id or unknown status.
func (k KeyState) Validate() error {
	if err := checkIDs("key id", k.ID, "provider", k.Provider, "pool", k.Pool); err != nil {
		return err
	}
	if !k.Status.Valid() {
		return invalidf("status of key %s: unknown", k.ID)
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
	// LastUsedAt is the key's last grant by the store's clock (ms), or the
	// KeyState.LastUsedAt it was seeded with; zero if neither.
	LastUsedAt time.Time
	// HeldUntil is when the hold ends that a store put on the key on
	// finding its state older than grants it had seen (see
	// Options.LostHold): the store lost leases that may still be in use,
	// and grants nothing on the key before then. Zero if none.
	HeldUntil time.Time
	// Unreachable says the server holding the key did not answer (on Redis
	// Cluster, its master is down while others answer): nothing else is
	// known of it, and Exists is false without meaning that the store
	// lacks it.
	Unreachable bool
}

// Validate returns an ErrInvalid naming the first bad field: a malformed
// id or a ttl under 1ms.
func (req AllocateRequest) Validate() error {
	if err := checkIDs("provider", req.Provider, "pool", req.Pool); err != nil {
		return err
	}
	if err := CheckKeyIDs(req.Candidates...); err != nil {
		return err
	}
	if req.Wait < 0 {
		return invalidf("wait %v: want zero (do not wait) or more", req.Wait)
	}
	return CheckTTL(req.TTL)
}

// Validate returns an ErrInvalid naming the first malformed id.
func (ref LeaseRef) Validate() error {
	return checkIDs("provider", ref.Provider, "pool", ref.Pool, "key id", ref.KeyID, "lease id", ref.LeaseID)
}
