package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/optimistic"
)

// Release gives a lease back (see optimistic.LeaseStore.Release). If the
// store fails, the caller gets the error and the broker keeps retrying the
// release in the background (see Backlog), so the slot returns as soon as
// the store does.
func (b *Broker) Release(ctx context.Context, ref optimistic.LeaseRef) error {
	err := b.store.Release(ctx, ref)
	switch {
	case err == nil:
		b.live.released(ref.KeyID)
	case !errors.Is(err, optimistic.ErrLeaseLost) && !errors.Is(err, optimistic.ErrInvalid):
		b.backlog.add(ref)
	}
	return err
}

// Renew extends a lease, unless the catalog no longer backs its key
// (deleted, moved, disabled, pending or exhausted): then the lease is
// released and the holder gets optimistic.ErrLeaseLost and must stop. A
// request id the lease answered keeps answering it until the new expiry.
func (b *Broker) Renew(ctx context.Context, ref optimistic.LeaseRef, ttl time.Duration) (time.Time, error) {
	until, _, err := b.renew(ctx, ref, ttl, b.catalog.Key)
	return until, err
}

// renew is Renew, returning the key as read reads it from the catalog:
// Catalog.Key for a heartbeat, Catalog.Get where the secret is handed out.
func (b *Broker) renew(ctx context.Context, ref optimistic.LeaseRef, ttl time.Duration,
	read func(ctx context.Context, id string) (catalog.Key, error),
) (time.Time, catalog.Key, error) {
	if err := ref.Validate(); err != nil {
		return time.Time{}, catalog.Key{}, err
	}
	if err := b.checkTTL(ttl); err != nil {
		return time.Time{}, catalog.Key{}, err
	}
	k, err := read(ctx, ref.KeyID)
	switch {
	case errors.Is(err, catalog.ErrNotFound):
		return time.Time{}, k, b.revoke(ctx, ref, "key deleted")
	case err != nil:
		return time.Time{}, k, catalogErr(ctx, "renew", err)
	case k.Provider != ref.Provider || k.Pool != ref.Pool:
		// The key moved since the grant, or the caller names another
		// owner than its lease's (a vip request served by default, renewed
		// as vip): the store tells, and the lease of a wrong name is left
		// alone.
		if _, err := b.store.Holds(ctx, ref); errors.Is(err, optimistic.ErrLeaseMismatch) {
			return time.Time{}, k, err
		}
		return time.Time{}, k, b.revoke(ctx, ref, "key moved to another provider or pool")
	case revoked(k.Status):
		return time.Time{}, k, b.revoke(ctx, ref, "key "+string(k.Status))
	}
	// Another lease store synced the key since this one granted the lease
	// (see syncer.moved): it held the key back for as long as a lease
	// lives, counting this store's leases out, so they end here.
	switch moved, err := b.moved(ctx, k, optimistic.KeyInfo{ID: k.ID, Exists: true}); {
	case err != nil:
		return time.Time{}, k, err
	case moved:
		return time.Time{}, k, b.revoke(ctx, ref, "key served by another lease store since")
	}
	until, err := b.store.Renew(ctx, ref, ttl)
	if err != nil {
		return time.Time{}, k, err
	}
	if b.requests != nil {
		if err := b.requests.Extend(ctx, ref.LeaseID, until); err != nil {
			b.log.WarnContext(ctx, "extend request id", "key_id", ref.KeyID, "lease_id", ref.LeaseID, "err", err)
		}
	}
	return until, k, nil
}

// revoked reports whether holders of a key with this status must stop.
// A rate-limited key's current holders may finish: they hold their slot.
func revoked(s optimistic.Status) bool {
	return s == optimistic.StatusDisabled || s == optimistic.StatusPending || s == optimistic.StatusExhausted
}

func (b *Broker) revoke(ctx context.Context, ref optimistic.LeaseRef, why string) error {
	if err := b.Release(ctx, ref); err != nil && !errors.Is(err, optimistic.ErrLeaseLost) {
		return err
	}
	return fmt.Errorf("%w: %s", optimistic.ErrLeaseLost, why)
}

// Report records the outcome of the caller's use of its lease in the
// catalog and releases the lease. A report counts only for a lease the
// caller still holds, and once per lease, so a report retried after its
// release failed (the store was down) completes the release without
// counting twice.
//
//   - success and error only count (written behind, see catalog.Cache):
//     the release comes first, and the outcome counts if it took the lease
//     back, so once per lease; a lost lease, or one of another provider or
//     pool, is that error and counts nothing. If the store fails, the
//     error is returned and the release retried in the background; the
//     report sent again counts, unless that retry released the lease
//     first (it then answers ErrLeaseLost, and the count is lost: counts
//     only rank keys).
//   - rate_limited (a cooldown of retryAfter) and auth_error (disabled)
//     change the key: the lease is checked first without giving it up, the
//     catalog written, the key's new state pushed to the store so no new
//     lease is granted against it, and only then the slot released; until
//     then the key is never granted against a stale state, since the slot
//     is still held.
func (b *Broker) Report(ctx context.Context, ref optimistic.LeaseRef, o catalog.Outcome, retryAfter time.Duration) error {
	if err := ref.Validate(); err != nil {
		return err
	}
	if !o.Valid() {
		return fmt.Errorf("%w: outcome: want success, error, rate_limited or auth_error", optimistic.ErrInvalid)
	}
	if o == catalog.OutcomeSuccess || o == catalog.OutcomeError {
		return b.count(ctx, ref, o)
	}
	if _, err := b.store.Holds(ctx, ref); err != nil {
		return err
	}
	k, err := b.catalog.Report(ctx, ref.KeyID, ref.LeaseID, o, retryAfter, time.Now())
	switch {
	case errors.Is(err, catalog.ErrNotFound):
		// Deleted meanwhile: nothing to record, the slot still goes back.
	case err != nil:
		return catalogErr(ctx, "report", err)
	default:
		if _, err := b.resync(ctx, k); err != nil {
			return err
		}
	}
	err = b.Release(ctx, ref)
	if errors.Is(err, optimistic.ErrLeaseLost) && !errors.Is(err, optimistic.ErrLeaseMismatch) {
		// It expired since the check: the outcome is recorded, the slot free.
		return nil
	}
	return err
}

// count is Report for an outcome that changes no state: release, then
// count if the release took the lease back.
func (b *Broker) count(ctx context.Context, ref optimistic.LeaseRef, o catalog.Outcome) error {
	if err := b.Release(ctx, ref); err != nil {
		return err
	}
	_, err := b.catalog.Report(ctx, ref.KeyID, ref.LeaseID, o, 0, time.Now())
	if err != nil && !errors.Is(err, catalog.ErrNotFound) {
		// Released: the caller is done; the count is lost, as in a crash.
		b.log.WarnContext(ctx, "count a report", "key_id", ref.KeyID, "lease_id", ref.LeaseID, "err", err)
	}
	return nil
}
