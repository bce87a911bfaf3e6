package optimistic

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	rs "github.com/credpool/credpool/internal/redisschema"
)

// Requests remembers, in Redis, which lease answered an allocate request
// id, so that a retried request gets the same lease back instead of a
// second slot. It is safe for concurrent use, across processes too.
//
// One string key per id, <prefix>:req:{<id>}: empty while the first request
// is in flight, then the lease as JSON, expiring with the lease.
type Requests struct {
	rdb  redis.UniversalClient
	keys rs.Schema
}

// Requests returns the request log that lives beside the store's leases.
func (s *Store) Requests() *Requests { return &Requests{rdb: s.rdb, keys: s.keys} }

// Claim reserves id for ttl. It returns claimed true if the caller now owns
// id and must Record or Forget it; else the lease that already answered id.
// ErrRequestInFlight if another caller owns id and has not recorded yet.
func (r *Requests) Claim(ctx context.Context, id string, ttl time.Duration) (Lease, bool, error) {
	// Two rounds: the answer may expire between SET NX and GET.
	for range 2 {
		ok, err := r.rdb.SetNX(ctx, r.keys.Request(id), "", ttl).Result()
		if err != nil {
			return Lease{}, false, Classify(ctx, "claim request", err)
		}
		if ok {
			return Lease{}, true, nil
		}
		raw, err := r.rdb.Get(ctx, r.keys.Request(id)).Result()
		switch {
		case errors.Is(err, redis.Nil):
			continue
		case err != nil:
			return Lease{}, false, Classify(ctx, "claim request", err)
		case raw == "":
			return Lease{}, false, ErrRequestInFlight
		}
		var l Lease
		if err := json.Unmarshal([]byte(raw), &l); err != nil {
			return Lease{}, false, Classify(ctx, "claim request", err)
		}
		return l, false, nil
	}
	return Lease{}, false, ErrRequestInFlight
}

// Record stores the lease that answered id until the lease ends.
func (r *Requests) Record(ctx context.Context, id string, l Lease) error {
	raw, err := json.Marshal(l)
	if err != nil {
		return err
	}
	err = r.rdb.SetArgs(ctx, r.keys.Request(id), raw, redis.SetArgs{ExpireAt: l.Until}).Err()
	return Classify(ctx, "record request", err)
}

// Forget drops id: its allocation failed or its lease is gone.
func (r *Requests) Forget(ctx context.Context, id string) error {
	return Classify(ctx, "forget request", r.rdb.Del(ctx, r.keys.Request(id)).Err())
}
