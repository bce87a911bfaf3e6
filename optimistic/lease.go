package optimistic

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	rs "github.com/credpool/credpool/internal/redisschema"
)

// recordFields are the lease record fields checked against a LeaseRef.
var recordFields = []string{rs.FieldKeyID, rs.FieldProvider, rs.FieldPool}

// Release deletes the lease if key id, provider, pool and lease id all
// match and it has not expired. Otherwise it returns ErrLeaseLost (unknown,
// released or expired; a wrong key id also looks unknown, since the record
// lives under the key) or ErrLeaseMismatch (wrong provider or pool), and
// writes nothing. Releasing twice is harmless: the second call is
// ErrLeaseLost. It never touches another lease.
func (s *Store) Release(ctx context.Context, ref LeaseRef) error {
	if err := ref.Validate(); err != nil {
		return err
	}
	rdb, err := s.owner(ctx, s.keys.Leases(ref.KeyID))
	if err != nil {
		return Classify(ctx, "release", err)
	}
	err = s.release(ctx, rdb, ref)
	if rerouted(err) {
		// The slot moved or is moving: let the cluster client follow it.
		err = s.release(ctx, s.rdb, ref)
	}
	return Classify(ctx, "release", err)
}

// Holds returns the lease's expiry if ref holds a live lease, else
// ErrLeaseLost or ErrLeaseMismatch as Release would. It reads only, in one
// round trip: a caller can prove it still holds a lease (before recording
// what it did with it, say) without giving it up.
func (s *Store) Holds(ctx context.Context, ref LeaseRef) (time.Time, error) {
	if err := ref.Validate(); err != nil {
		return time.Time{}, err
	}
	rdb, err := s.owner(ctx, s.keys.Leases(ref.KeyID))
	if err != nil {
		return time.Time{}, Classify(ctx, "holds", err)
	}
	_, until, err := s.holder(ctx, rdb, ref)
	if rerouted(err) {
		_, until, err = s.holder(ctx, s.rdb, ref)
	}
	if err != nil {
		return time.Time{}, Classify(ctx, "holds", err)
	}
	return fromMillis(until), nil
}

// holder reads whether ref holds a live lease, by the clock of the node
// that owns it, and returns that clock's now and the lease's expiry (ms).
func (s *Store) holder(ctx context.Context, rdb redis.UniversalClient, ref LeaseRef) (now, until int64, err error) {
	var (
		clock  *redis.TimeCmd
		record *redis.SliceCmd
		score  *redis.FloatCmd
	)
	_, err = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		clock = p.Time(ctx)
		record = p.HMGet(ctx, s.keys.Lease(ref.KeyID, ref.LeaseID), recordFields...)
		score = p.ZScore(ctx, s.keys.Leases(ref.KeyID), ref.LeaseID)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, 0, err
	}
	now = clock.Val().UnixMilli()
	if err := checkHolder(ref, record.Val(), score, now); err != nil {
		return 0, 0, err
	}
	return now, int64(score.Val()), nil
}

func (s *Store) release(ctx context.Context, rdb redis.UniversalClient, ref LeaseRef) error {
	leasesKey, recordKey := s.keys.Leases(ref.KeyID), s.keys.Lease(ref.KeyID, ref.LeaseID)
	if _, _, err := s.holder(ctx, rdb, ref); err != nil {
		return err
	}
	// No WATCH needed: the lease id is unique, so these writes can only hit
	// this lease. If it expired and was pruned meanwhile, ZREM says so.
	var del, removed *redis.IntCmd
	_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		del = p.Del(ctx, recordKey)
		removed = p.ZRem(ctx, leasesKey, ref.LeaseID)
		return nil
	})
	if err != nil {
		return aborted(err, []redis.Cmder{del, removed})
	}
	if removed.Val() == 0 {
		return NotHeld(ref.LeaseID, LostExpired)
	}
	return nil
}

// Renew moves a live lease's expiry to now+ttl (store clock) and returns it.
// A lease that expired, was released or pruned, or does not match is lost
// (ErrLeaseLost, ErrLeaseMismatch) and is never recreated. On error nothing
// is written. Renew does not take the key's gate (see Allocate): a
// heartbeat never queues behind this process's allocations.
//
// It needs no WATCH, so it never conflicts: a renewal on a hot key never
// fails as contended. The lease id is unique and ZADD XX only updates a
// member still there: a lease released or pruned since the read stays
// gone. One that expires between the read and the write may be extended,
// which is safe: an allocator that counted it expired either pruned it
// first (the write then finds nothing) or watches the lease ZSET, so the
// write aborts its EXEC and it reads again.
func (s *Store) Renew(ctx context.Context, ref LeaseRef, ttl time.Duration) (time.Time, error) {
	if err := ref.Validate(); err != nil {
		return time.Time{}, err
	}
	if err := CheckTTL(ttl); err != nil {
		return time.Time{}, err
	}
	rdb, err := s.owner(ctx, s.keys.Leases(ref.KeyID))
	if err != nil {
		return time.Time{}, Classify(ctx, "renew", err)
	}
	until, err := s.renew(ctx, rdb, ref, ttl)
	if rerouted(err) {
		until, err = s.renew(ctx, s.rdb, ref, ttl)
	}
	if err != nil {
		return time.Time{}, Classify(ctx, "renew", err)
	}
	return fromMillis(until), nil
}

func (s *Store) renew(ctx context.Context, rdb redis.UniversalClient, ref LeaseRef, ttl time.Duration) (int64, error) {
	leasesKey, recordKey := s.keys.Leases(ref.KeyID), s.keys.Lease(ref.KeyID, ref.LeaseID)
	now, _, err := s.holder(ctx, rdb, ref)
	if err != nil {
		return 0, err
	}
	until := now + ttl.Milliseconds()
	replies, err := s.write(ctx, rdb, []cmd{
		{"zadd", leasesKey, "xx", until, ref.LeaseID},
		{"zscore", leasesKey, ref.LeaseID},
		{"hset", recordKey, rs.FieldUntil, until},
		{"pexpireat", recordKey, until + s.opts.RecordGrace.Milliseconds()},
	})
	if err != nil {
		// errUnreplicated included: the new expiry may not survive a
		// failover, so the holder must go by the previous one.
		return 0, err
	}
	if len(replies) < 2 || replies[1] == nil {
		// Gone since the read: the HSET made a stray record of it. Deleted
		// even after ctx ended, and bounded as an UNWATCH is; if this
		// fails, the record expires by itself after RecordGrace.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unwatchTimeout)
		defer cancel()
		_ = rdb.Del(dctx, recordKey).Err()
		return 0, NotHeld(ref.LeaseID, LostExpired)
	}
	return until, nil
}

// checkHolder says whether ref holds a live lease, given its record (HMGET
// recordFields) and its score in the key's lease ZSET.
func checkHolder(ref LeaseRef, record []any, score *redis.FloatCmd, now int64) error {
	got := make([]string, len(recordFields))
	for i, v := range record {
		got[i], _ = v.(string)
	}
	if got[0] == "" {
		return NotHeld(ref.LeaseID, LostUnknown)
	}
	if got[0] != ref.KeyID || got[1] != ref.Provider || got[2] != ref.Pool {
		return NotHeld(ref.LeaseID, LostMismatch)
	}
	if score.Err() != nil || int64(score.Val()) <= now {
		return NotHeld(ref.LeaseID, LostExpired)
	}
	return nil
}
