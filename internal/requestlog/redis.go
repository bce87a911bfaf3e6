package requestlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	rs "github.com/credpool/credpool/internal/redisschema"
	"github.com/credpool/credpool/internal/retry"
	"github.com/credpool/credpool/optimistic"
)

// Redis is the request log in Redis, beside the leases of a store with the
// same prefix. It is safe for concurrent use, across processes too.
//
// One string per id, <prefix>:req:{<id>}, holds the record as JSON and
// expires with the claim, then with the lease; <prefix>:req-lease:{<lease
// id>} names the id a lease answered, so that Extend can find it.
type Redis struct {
	rdb  redis.UniversalClient
	keys rs.Schema
}

// NewRedis returns the request log under prefix, which must be the
// store's; "" means redisschema.DefaultPrefix. A prefix that could not
// start a key name (one with braces) is refused.
func NewRedis(rdb redis.UniversalClient, prefix string) (*Redis, error) {
	if prefix == "" {
		prefix = rs.DefaultPrefix
	}
	if !rs.ValidPrefix(prefix) {
		return nil, fmt.Errorf("%w: request log prefix %q must not contain braces", optimistic.ErrInvalid, prefix)
	}
	return &Redis{rdb: rdb, keys: rs.Schema{Prefix: prefix}}, nil
}

// Claim reserves id for the caller holding token, for at least ttl, with
// the request's parameters summed up in fingerprint. claimed is true if the
// caller holds it now, also when a claim of its own was already there;
// otherwise Claim returns the recorded lease and its holder's token, or
// ErrInFlight, or ErrReused.
func (r *Redis) Claim(ctx context.Context, id, token, fingerprint string, ttl time.Duration) (Entry, bool, error) {
	raw, err := json.Marshal(record{Token: token, Fingerprint: fingerprint})
	if err != nil {
		return Entry{}, false, err
	}
	key := r.keys.Request(id)
	// Two rounds: what SET NX found may expire before GET reads it.
	for range 2 {
		ok, err := r.rdb.SetNX(ctx, key, raw, max(ttl, claimFloor)).Result()
		if err != nil {
			return Entry{}, false, optimistic.Classify(ctx, "claim request", err)
		}
		if ok {
			return Entry{}, true, nil
		}
		rec, found, err := r.read(ctx, r.rdb, key)
		if err != nil {
			return Entry{}, false, optimistic.Classify(ctx, "claim request", err)
		}
		if found {
			return judge(rec, token, fingerprint)
		}
	}
	return Entry{}, false, ErrInFlight
}

// read fetches and decodes the record under key.
func (r *Redis) read(ctx context.Context, c redis.Cmdable, key string) (record, bool, error) {
	raw, err := c.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return record{}, false, nil
	}
	if err != nil {
		return record{}, false, err
	}
	var rec record
	if err := json.Unmarshal(raw, &rec); err != nil {
		return record{}, false, fmt.Errorf("request record %s: %w", key, err)
	}
	return rec, true, nil
}

// Record stores l as the answer to id, which the caller must still hold
// by token (else ErrClaimLost, and nothing changes), until l ends.
func (r *Redis) Record(ctx context.Context, id, token string, l optimistic.Lease) error {
	key := r.keys.Request(id)
	err := r.update(ctx, key, token, func(tx *redis.Tx, rec record) error {
		rec.Lease = &l
		raw, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.SetArgs(ctx, key, raw, redis.SetArgs{ExpireAt: l.Until})
			return nil
		})
		return err
	})
	if errors.Is(err, ErrClaimLost) {
		return err
	}
	if err != nil {
		return optimistic.Classify(ctx, "record request", err)
	}
	// Another slot on a cluster: not in the transaction. If it is lost,
	// renewals cannot extend the record, which then ends with the lease's
	// first expiry.
	err = r.rdb.SetArgs(ctx, r.keys.RequestByLease(l.LeaseID), id, redis.SetArgs{ExpireAt: l.Until}).Err()
	return optimistic.Classify(ctx, "record request", err)
}

// Forget frees id if token holds it (a claim or its recorded lease); an id
// held by someone else, or no longer held at all, is left alone.
func (r *Redis) Forget(ctx context.Context, id, token string) error {
	key := r.keys.Request(id)
	err := r.update(ctx, key, token, func(tx *redis.Tx, _ record) error {
		_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Del(ctx, key)
			return nil
		})
		return err
	})
	if errors.Is(err, ErrClaimLost) {
		return nil
	}
	return optimistic.Classify(ctx, "forget request", err)
}

// Extend keeps the record that a lease answered until that lease's new
// expiry, so a renewed lease stays the answer to its request id. A lease
// that answered no id is nothing to extend.
func (r *Redis) Extend(ctx context.Context, leaseID string, until time.Time) error {
	index := r.keys.RequestByLease(leaseID)
	id, err := r.rdb.Get(ctx, index).Result()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		return optimistic.Classify(ctx, "extend request", err)
	}
	// GT: never shortens, so a record that moved on to a later lease keeps
	// its own expiry. Two slots, so two commands, in one round trip.
	ms := until.UnixMilli()
	_, err = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "pexpireat", r.keys.Request(id), ms, "gt")
		p.Do(ctx, "pexpireat", index, ms, "gt")
		return nil
	})
	return optimistic.Classify(ctx, "extend request", err)
}

// update runs write on key's record under WATCH if token holds it, else
// returns ErrClaimLost. A write that lost a race is retried.
func (r *Redis) update(ctx context.Context, key, token string, write func(*redis.Tx, record) error) error {
	return retry.Do(ctx, retry.Policy{}, func(err error) bool { return errors.Is(err, redis.TxFailedErr) }, func() error {
		return r.rdb.Watch(ctx, func(tx *redis.Tx) error {
			rec, found, err := r.read(ctx, tx, key)
			if err != nil {
				return err
			}
			if !found || rec.Token != token {
				return ErrClaimLost
			}
			return write(tx, rec)
		}, key)
	})
}
