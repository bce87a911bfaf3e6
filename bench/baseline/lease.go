package baseline

import (
	"context"
	"fmt"
	"time"

	rs "github.com/credpool/credpool/internal/redisschema"
	"github.com/credpool/credpool/optimistic"
)

// Release deletes the lease if key id, provider, pool and lease id all
// match and it has not expired, in one run of release.lua. Otherwise it
// returns ErrLeaseLost (unknown, released or expired; a wrong key id also
// looks unknown, since the record lives under the key) or ErrLeaseMismatch
// (wrong provider or pool), and writes nothing. Releasing twice is harmless:
// the second call is ErrLeaseLost. It never touches another lease.
func (s *Store) Release(ctx context.Context, ref optimistic.LeaseRef) error {
	if err := ref.Validate(); err != nil {
		return err
	}
	why, err := releaseScript.Run(ctx, s.rdb, s.leaseKeys(ref), member(ref), ref.LeaseID).Text()
	if err != nil {
		return optimistic.Classify(ctx, "release", err)
	}
	if why == "released" {
		return nil
	}
	return notHeld(ctx, "release", ref.LeaseID, why)
}

// Renew moves a live lease's expiry to now+ttl (Redis clock) and returns it,
// in one run of renew.lua. A lease that expired, was released or pruned, or
// does not match is lost (ErrLeaseLost, ErrLeaseMismatch) and is never
// recreated. On error nothing is written.
func (s *Store) Renew(ctx context.Context, ref optimistic.LeaseRef, ttl time.Duration) (time.Time, error) {
	if err := ref.Validate(); err != nil {
		return time.Time{}, err
	}
	if err := optimistic.CheckTTL(ttl); err != nil {
		return time.Time{}, err
	}
	res, err := renewScript.Run(ctx, s.rdb, s.leaseKeys(ref),
		member(ref), ref.LeaseID, ttl.Milliseconds(), s.opts.RecordGrace.Milliseconds(),
	).Result()
	if err != nil {
		return time.Time{}, optimistic.Classify(ctx, "renew", err)
	}
	if until, ok := res.(int64); ok {
		return time.UnixMilli(until), nil
	}
	why, _ := res.(string)
	return time.Time{}, notHeld(ctx, "renew", ref.LeaseID, why)
}

// leaseKeys are KEYS of release.lua and renew.lua.
func (s *Store) leaseKeys(ref optimistic.LeaseRef) []string {
	return []string{s.keys.Leases(ref.KeyID), s.keys.Lease(ref.KeyID, member(ref))}
}

// member is ref's member in its key's lease ZSET.
func member(ref optimistic.LeaseRef) string { return rs.Member(ref.LeaseID, ref.Provider, ref.Pool) }

// notHeld turns a script's reason for refusing a lease into the contract's
// error, worded as every store words it.
func notHeld(ctx context.Context, op, leaseID, why string) error {
	switch loss := optimistic.Loss(why); loss {
	case optimistic.LostUnknown, optimistic.LostMismatch, optimistic.LostExpired:
		return optimistic.NotHeld(leaseID, loss)
	}
	return optimistic.Classify(ctx, op, fmt.Errorf("unexpected script reply %q", why))
}
