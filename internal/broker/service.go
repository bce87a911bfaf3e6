package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/optimistic"
)

// Release gives a lease back. See optimistic.LeaseStore.Release.
func (b *Broker) Release(ctx context.Context, ref optimistic.LeaseRef) error {
	return b.store.Release(ctx, ref)
}

// Renew extends a lease, unless the catalog no longer backs its key
// (deleted, moved, disabled, pending or exhausted): then the lease is
// released and the holder gets optimistic.ErrLeaseLost and must stop.
func (b *Broker) Renew(ctx context.Context, ref optimistic.LeaseRef, ttl time.Duration) (time.Time, error) {
	if err := ref.Validate(); err != nil {
		return time.Time{}, err
	}
	k, err := b.catalog.Get(ctx, ref.KeyID)
	switch {
	case errors.Is(err, catalog.ErrNotFound):
		return time.Time{}, b.revoke(ctx, ref, "key deleted")
	case err != nil:
		return time.Time{}, catalogErr(ctx, "renew", err)
	case k.Provider != ref.Provider || k.Pool != ref.Pool:
		return time.Time{}, b.revoke(ctx, ref, "key moved to another provider or pool")
	case revoked(k.Status):
		return time.Time{}, b.revoke(ctx, ref, "key "+string(k.Status))
	}
	return b.store.Renew(ctx, ref, ttl)
}

// revoked reports whether holders of a key with this status must stop.
// A rate-limited key's current holders may finish: they hold their slot.
func revoked(s optimistic.Status) bool {
	return s == optimistic.StatusDisabled || s == optimistic.StatusPending || s == optimistic.StatusExhausted
}

func (b *Broker) revoke(ctx context.Context, ref optimistic.LeaseRef, why string) error {
	if err := b.store.Release(ctx, ref); err != nil && !errors.Is(err, optimistic.ErrLeaseLost) {
		return err
	}
	return fmt.Errorf("%w: %s", optimistic.ErrLeaseLost, why)
}

// Report releases the lease and records the outcome of that use of its key
// in the catalog (counters; rate_limited starts or extends a cooldown of
// retryAfter; auth_error disables the key), then pushes the key's new state
// to the store so no new lease is granted against it. A report counts only
// for a lease the caller still holds: if the release says the lease is
// lost or belongs to another provider or pool, that error is returned and
// the catalog is left alone, so a repeated or misdirected report cannot
// count twice or touch someone else's key.
func (b *Broker) Report(ctx context.Context, ref optimistic.LeaseRef, o catalog.Outcome, retryAfter time.Duration) error {
	if err := ref.Validate(); err != nil {
		return err
	}
	if !o.Valid() {
		return fmt.Errorf("%w: outcome %q: want success, error, rate_limited or auth_error", optimistic.ErrInvalid, o)
	}
	if err := b.store.Release(ctx, ref); err != nil {
		return err
	}
	k, err := b.catalog.Report(ctx, ref.KeyID, o, retryAfter, time.Now())
	if errors.Is(err, catalog.ErrNotFound) {
		return nil
	}
	if err != nil {
		return catalogErr(ctx, "report", err)
	}
	if o == catalog.OutcomeRateLimited || o == catalog.OutcomeAuthError {
		return b.store.SyncKey(ctx, k.LeaseState())
	}
	return nil
}
