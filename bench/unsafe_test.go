package bench_test

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/credpool/credpool/bench"
	"github.com/credpool/credpool/optimistic"
)

// unsafeStrategy is the store the oversell audit must catch.
var unsafeStrategy = bench.Strategy{Name: "unsafe", Redis: true, Open: func(_ context.Context, t bench.Target) (optimistic.LeaseStore, error) {
	return &unsafeStore{rdb: t.Redis, prefix: t.Prefix}, nil
}}

// unsafeStore is the check-then-act that credpool exists to replace: GET
// the holder count, compare it with the limit in Go, then INCR it and ZADD
// the lease. Two callers that read the same count both take the last slot.
// Releases DECR the count, so once everyone has released, the stored state
// looks fine again.
type unsafeStore struct {
	rdb    redis.UniversalClient
	prefix string
}

func (s *unsafeStore) key(id, part string) string { return s.prefix + ":unsafe:{" + id + "}:" + part }

func (s *unsafeStore) Allocate(ctx context.Context, req optimistic.AllocateRequest) (optimistic.Lease, optimistic.Stats, error) {
	var st optimistic.Stats
	for _, id := range req.Candidates {
		st.Attempts++
		limit, err := s.rdb.Get(ctx, s.key(id, "limit")).Int()
		if err != nil {
			return optimistic.Lease{}, st, optimistic.Classify(ctx, "allocate", err)
		}
		n, err := s.rdb.Get(ctx, s.key(id, "count")).Int()
		if err != nil && !errors.Is(err, redis.Nil) {
			return optimistic.Lease{}, st, optimistic.Classify(ctx, "allocate", err)
		}
		if n >= limit {
			continue
		}
		lease := optimistic.Lease{
			LeaseRef: optimistic.LeaseRef{Provider: req.Provider, Pool: req.Pool, KeyID: id, LeaseID: uuid.NewString()},
			Until:    time.Now().Add(req.TTL),
		}
		if err := s.rdb.Incr(ctx, s.key(id, "count")).Err(); err != nil {
			return optimistic.Lease{}, st, optimistic.Classify(ctx, "allocate", err)
		}
		err = s.rdb.ZAdd(ctx, s.key(id, "leases"), redis.Z{Score: float64(lease.Until.UnixMilli()), Member: lease.LeaseID}).Err()
		if err != nil {
			return optimistic.Lease{}, st, optimistic.Classify(ctx, "allocate", err)
		}
		return lease, st, nil
	}
	return optimistic.Lease{}, st, &optimistic.CapacityError{}
}

func (s *unsafeStore) Release(ctx context.Context, ref optimistic.LeaseRef) error {
	removed, err := s.rdb.ZRem(ctx, s.key(ref.KeyID, "leases"), ref.LeaseID).Result()
	if err != nil {
		return optimistic.Classify(ctx, "release", err)
	}
	if removed == 0 {
		return optimistic.ErrLeaseLost
	}
	if err := s.rdb.Decr(ctx, s.key(ref.KeyID, "count")).Err(); err != nil {
		return optimistic.Classify(ctx, "release", err)
	}
	return nil
}

func (s *unsafeStore) Holds(context.Context, optimistic.LeaseRef) (time.Time, error) {
	return time.Time{}, errors.New("unsafe store: holds is not implemented")
}

func (s *unsafeStore) Renew(context.Context, optimistic.LeaseRef, time.Duration) (time.Time, error) {
	return time.Time{}, errors.New("unsafe store: renew is not implemented")
}

func (s *unsafeStore) SyncKey(ctx context.Context, k optimistic.KeyState) error {
	return s.rdb.Set(ctx, s.key(k.ID, "limit"), k.MaxConcurrentUses, 0).Err()
}

func (s *unsafeStore) DeleteKey(ctx context.Context, id string) error {
	return s.rdb.Del(ctx, s.key(id, "limit"), s.key(id, "count"), s.key(id, "leases")).Err()
}

func (s *unsafeStore) ClearLeases(ctx context.Context, id string) (int, error) {
	n, err := s.rdb.ZCard(ctx, s.key(id, "leases")).Result()
	if err != nil {
		return 0, err
	}
	return int(n), s.rdb.Del(ctx, s.key(id, "count"), s.key(id, "leases")).Err()
}

// Inspect reports the stored count, as a state check would read it.
func (s *unsafeStore) Inspect(ctx context.Context, ids ...string) ([]optimistic.KeyInfo, error) {
	out := make([]optimistic.KeyInfo, len(ids))
	for i, id := range ids {
		limit, err := s.rdb.Get(ctx, s.key(id, "limit")).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		count, err := s.rdb.Get(ctx, s.key(id, "count")).Int()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		out[i] = optimistic.KeyInfo{ID: id, Exists: limit != "", Limit: optimistic.ParseLimit(limit), Live: count}
		if out[i].Exists {
			out[i].Status = optimistic.StatusAvailable
		}
	}
	return out, nil
}

func (s *unsafeStore) Ping(ctx context.Context) error {
	return optimistic.Classify(ctx, "ping", s.rdb.Ping(ctx).Err())
}

// forgetfulStrategy is the WATCH/MULTI store with an expiry bug: it asks
// Redis for a tenth of the TTL its callers want and tells them the lease
// lasts all of it. A caller that releases in time never notices; a crashed
// caller's slot is handed on while its lease should still be live.
var forgetfulStrategy = bench.Strategy{Name: "forgetful", Redis: true, Open: func(_ context.Context, t bench.Target) (optimistic.LeaseStore, error) {
	store, err := optimistic.New(t.Redis, &optimistic.Options{Prefix: t.Prefix})
	if err != nil {
		return nil, err
	}
	return forgetfulStore{store}, nil
}}

type forgetfulStore struct{ optimistic.LeaseStore }

func (s forgetfulStore) Allocate(ctx context.Context, req optimistic.AllocateRequest) (optimistic.Lease, optimistic.Stats, error) {
	ttl := req.TTL
	req.TTL /= 10
	lease, st, err := s.LeaseStore.Allocate(ctx, req)
	if err == nil {
		lease.Until = lease.Until.Add(ttl - req.TTL)
	}
	return lease, st, err
}
