package bench_test

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	rs "github.com/credpool/credpool/internal/redisschema"
	"github.com/credpool/credpool/optimistic"
)

// bareStore allocates and releases with go-redis as a WATCH/MULTI client
// must at least, on the optimistic store's keys (which it embeds for the
// rest): per candidate, one pipeline of WATCH of the key HASH, TIME and
// the reads the store takes (after UNWATCH of a candidate read with no
// slot); if the key serves the pool, is usable, is not held back and has
// room, one MULTI that prunes its expired leases and writes the lease,
// its record and the HASH. A release is one MULTI of its own.
//
// It does less than a store must, so it is a floor: none of the optimistic
// store's gate, hold-offs, shared releases, lost-reply rechecks, fences
// kept per key or wake-ups; a conflict just moves on to the next
// candidate; Release does not say whether the lease was held. Safe for
// concurrent use.
type bareStore struct {
	optimistic.LeaseStore
	rdb  *redis.Client
	keys rs.Schema
}

var _ optimistic.LeaseStore = (*bareStore)(nil)

// bareFields are the key HASH fields the optimistic store reads.
var bareFields = []string{rs.FieldProvider, rs.FieldPool, rs.FieldStatus, rs.FieldCooldown, rs.FieldLimit,
	rs.FieldFence, rs.FieldLastUsed, rs.FieldHeld, rs.FieldSeq}

func (s *bareStore) Allocate(ctx context.Context, req optimistic.AllocateRequest) (optimistic.Lease, optimistic.Stats, error) {
	var (
		st    optimistic.Stats
		lease optimistic.Lease
	)
	leaseID := uuid.NewString()
	member := rs.Member(leaseID, req.Provider, req.Pool)
	// A Watch with no keys runs fn on one pooled connection at once, and
	// sends no UNWATCH of its own: fn sends WATCH, so it releases it.
	err := s.rdb.Watch(ctx, func(tx *redis.Tx) error {
		watching := false
		for _, id := range req.Candidates {
			st.Attempts++
			until, fence, err := s.try(ctx, tx, id, member, req, watching)
			switch {
			case errors.Is(err, redis.TxFailedErr):
				// EXEC ran, and dropped the WATCH.
				st.Conflicts++
				watching = false
			case err != nil:
				// The WATCH may be live: the connection goes back to the
				// pool unwatched.
				return errors.Join(err, tx.Unwatch(ctx).Err())
			case until > 0:
				lease = optimistic.Lease{
					LeaseRef: optimistic.LeaseRef{KeyID: id, LeaseID: leaseID, Provider: req.Provider, Pool: req.Pool},
					Until:    time.UnixMilli(until), Fence: fence,
				}
				return nil
			default:
				watching = true
			}
		}
		if watching {
			return errors.Join(&optimistic.CapacityError{}, tx.Unwatch(ctx).Err())
		}
		return &optimistic.CapacityError{}
	})
	return lease, st, err
}

// try reads keyID under WATCH (UNWATCH first if watching) and claims a
// slot if it has one: it returns the lease's expiry (ms) and fence, 0 if
// the key had no slot for req, and then still watches it.
func (s *bareStore) try(ctx context.Context, tx *redis.Tx, keyID, member string, req optimistic.AllocateRequest, watching bool) (until, fence int64, err error) {
	keyKey, leasesKey := s.keys.Key(keyID), s.keys.Leases(keyID)
	var (
		clock  *redis.TimeCmd
		hash   *redis.SliceCmd
		leases *redis.ZSliceCmd
	)
	if _, err := tx.Pipelined(ctx, func(p redis.Pipeliner) error {
		if watching {
			p.Do(ctx, "unwatch")
		}
		p.Do(ctx, "watch", keyKey)
		clock = p.Time(ctx)
		hash = p.HMGet(ctx, keyKey, bareFields...)
		leases = p.ZRangeWithScores(ctx, leasesKey, 0, -1)
		return nil
	}); err != nil {
		return 0, 0, err
	}
	now := clock.Val().UnixMilli()
	k := hash.Val()
	held, _ := strconv.ParseInt(str(k[7]), 10, 64)
	var expired []string
	for _, z := range leases.Val() {
		if int64(z.Score) <= now {
			expired = append(expired, z.Member.(string))
		}
	}
	if str(k[0]) != req.Provider || str(k[1]) != req.Pool || !optimistic.Usable(optimistic.Status(str(k[2])), str(k[3]), now) ||
		held > now || len(leases.Val())-len(expired) >= optimistic.ParseLimit(str(k[4])) {
		return 0, 0, nil
	}
	last, _ := strconv.ParseInt(str(k[5]), 10, 64)
	until = now + req.TTL.Milliseconds()
	fence = optimistic.NextFence(last, clock.Val())
	recordKey := s.keys.Lease(keyID, member)
	_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for _, m := range expired {
			p.ZRem(ctx, leasesKey, m)
			p.Del(ctx, s.keys.Lease(keyID, m))
		}
		p.ZAdd(ctx, leasesKey, redis.Z{Score: float64(until), Member: member})
		p.HSet(ctx, recordKey, rs.FieldKeyID, keyID, rs.FieldProvider, req.Provider, rs.FieldPool, req.Pool,
			rs.FieldUntil, until, rs.FieldFence, fence)
		p.PExpireAt(ctx, recordKey, time.UnixMilli(until).Add(time.Minute))
		p.HSet(ctx, keyKey, rs.FieldStatus, string(optimistic.StatusAvailable), rs.FieldCooldown, "",
			rs.FieldLastUsed, now, rs.FieldFence, fence)
		return nil
	})
	return until, fence, err
}

func (s *bareStore) Release(ctx context.Context, ref optimistic.LeaseRef) error {
	member := rs.Member(ref.LeaseID, ref.Provider, ref.Pool)
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, s.keys.Leases(ref.KeyID), member)
		p.Del(ctx, s.keys.Lease(ref.KeyID, member))
		return nil
	})
	return err
}

// str is a HMGET field's value, "" if missing.
func str(v any) string {
	s, _ := v.(string)
	return s
}
