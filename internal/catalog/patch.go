package catalog

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/credpool/credpool/optimistic"
)

// Patch is the part of a key Update changes; a nil field is kept. The
// secret and provider are not in it: those change only by Put.
type Patch struct {
	Pool   *string
	Models []string
	Status *optimistic.Status
	// CooldownUntil goes with Status rate_limited or cooldown only; nil
	// with a Status is no end.
	CooldownUntil     *time.Time
	MaxConcurrentUses *int
}

// Update changes the fields p sets of key id, in one transaction, and
// returns the key as stored, without its secret; ErrNotFound if there is
// none. It is what an operator uses to disable a key, or change its limit,
// without its secret at hand. Everything p leaves nil is kept, and so are
// the counters, use times and quarantine, as Put keeps them.
func (s *SQL) Update(ctx context.Context, id string, p Patch) (Key, error) {
	if p.CooldownUntil != nil && !Cools(p.Status) {
		return Key{}, invalidf("cooldown_until of key %s: want it with status rate_limited or cooldown", id)
	}
	if p.Pool == nil && p.Models == nil && p.Status == nil && p.MaxConcurrentUses == nil {
		return Key{}, invalidf("update of key %s: want a field to change", id)
	}
	var stored Key
	err := s.write(ctx, fmt.Sprintf("update key %q", id), func(tx txn, gen int64) error {
		// The secret as stored (sealed), written back as it is.
		k, err := getKey(ctx, tx, id, true)
		if err != nil {
			return err
		}
		p.apply(&k)
		if err := validate(k); err != nil {
			return err
		}
		// Zero counters and times are kept by the upsert: a flush written
		// behind meanwhile is not undone.
		k.Successes, k.Errors, k.RateLimitHits = 0, 0, 0
		k.LastUsedAt, k.LastVerifiedAt, k.CreatedAt = time.Time{}, time.Time{}, time.Time{}
		if err := (putRow{k: k, secret: k.Secret.Reveal()}).put(ctx, tx, gen, time.Now().UnixMilli()); err != nil {
			return err
		}
		stored, err = getKey(ctx, tx, id, false)
		return err
	})
	if err != nil {
		return Key{}, err
	}
	return stored, nil
}

func (p Patch) apply(k *Key) {
	if p.Pool != nil {
		k.Pool = *p.Pool
	}
	if p.Models != nil {
		k.Models = slices.Compact(slices.Sorted(slices.Values(p.Models)))
	}
	if p.MaxConcurrentUses != nil {
		k.MaxConcurrentUses = *p.MaxConcurrentUses
	}
	if p.Status != nil {
		k.Status, k.CooldownUntil = *p.Status, time.Time{}
		if p.CooldownUntil != nil {
			k.CooldownUntil = p.CooldownUntil.Truncate(time.Millisecond)
		}
	}
}

// Cools reports whether status, if given, is one that a cooldown_until
// goes with: rate_limited or cooldown.
func Cools(status *optimistic.Status) bool {
	return status != nil && (*status == optimistic.StatusRateLimited || *status == optimistic.StatusCooldown)
}
