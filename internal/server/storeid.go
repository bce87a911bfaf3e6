package server

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"

	"github.com/credpool/credpool/internal/broker"
	rs "github.com/credpool/credpool/internal/redisschema"
	"github.com/credpool/credpool/optimistic"
)

var _ broker.IDStore = redisIDs{}

// redisIDs keeps the Redis store's id in one string under the store's
// prefix (rs.Schema.StoreID), with no expiry. It is safe for concurrent
// use.
type redisIDs struct {
	rdb redis.UniversalClient
	key string
}

func newRedisIDs(rdb redis.UniversalClient, prefix string) redisIDs {
	return redisIDs{rdb: rdb, key: rs.Schema{Prefix: prefix}.StoreID()}
}

// EnsureID reads the store's id, and writes id with SET NX if there is
// none: of instances that write at once, one wins and all read its id.
// A Redis that holds an id is only read, so a read-only one still answers.
func (r redisIDs) EnsureID(ctx context.Context, id string) (string, bool, error) {
	have, err := r.rdb.Get(ctx, r.key).Result()
	if !errors.Is(err, redis.Nil) {
		return have, false, optimistic.Classify(ctx, "read store id", err)
	}
	// With GET, SET NX answers the value it found, or nil if it wrote.
	have, err = r.rdb.SetArgs(ctx, r.key, id, redis.SetArgs{Mode: "NX", Get: true}).Result()
	if errors.Is(err, redis.Nil) {
		return id, true, nil
	}
	if err != nil {
		return "", false, optimistic.Classify(ctx, "write store id", err)
	}
	return have, false, nil
}
