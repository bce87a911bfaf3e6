package baseline

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/credpool/credpool/internal/keygate"
	rs "github.com/credpool/credpool/internal/redisschema"
	"github.com/credpool/credpool/optimistic"
)

var _ optimistic.LeaseStore = (*Store)(nil)

// Options configure a Store. A nil *Options means all defaults.
type Options struct {
	// Prefix starts every Redis key name; it must not contain braces. Stores
	// with the same prefix share keys, whichever their kind.
	//
	// default: "credpool"
	Prefix string

	// RecordGrace is how long a lease record outlives its lease before Redis
	// expires it by itself (it is normally deleted earlier, by release or
	// prune).
	//
	// default: 1m
	RecordGrace time.Duration

	// Gate gives Allocate the optimistic store's per-key turn within this
	// process (internal/keygate): no two calls of one store run the script
	// on the same key at once, and a candidate whose turn is taken is tried
	// after the others. It exists so the benchmark compares the two stores
	// with the same admission control (lua+gate against optimistic);
	// Release, Renew and the admin scripts never take it.
	//
	// default: false (no gate, as the seed)
	Gate bool
}

func (o *Options) withDefaults() Options {
	var out Options
	if o != nil {
		out = *o
	}
	if out.Prefix == "" {
		out.Prefix = rs.DefaultPrefix
	}
	if out.RecordGrace <= 0 {
		out.RecordGrace = time.Minute
	}
	return out
}

// Store is the lease store on Redis Lua scripts. It is safe for concurrent
// use; a call holds a pooled connection only for one command at a time.
type Store struct {
	rdb  redis.UniversalClient
	opts Options
	keys rs.Schema
	// gates are the per-key turns of Options.Gate.
	gates keygate.Set
	// direct runs SyncKey, Inspect, Holds and Ping, which need no script.
	direct *optimistic.Store
}

// New returns a Store over rdb: a standalone, Sentinel (failover) or Cluster
// client.
func New(rdb redis.UniversalClient, opts *Options) (*Store, error) {
	if rdb == nil {
		return nil, errors.New("baseline: nil redis client")
	}
	o := opts.withDefaults()
	// optimistic.New validates the prefix, so both stores accept the same ones.
	direct, err := optimistic.New(rdb, &optimistic.Options{Prefix: o.Prefix})
	if err != nil {
		return nil, err
	}
	return &Store{rdb: rdb, opts: o, keys: rs.Schema{Prefix: o.Prefix}, direct: direct}, nil
}

// SyncKey upserts a key's allocation state and pool membership with the
// optimistic store's commands; see optimistic.Store.SyncKey for what a
// failure leaves behind.
func (s *Store) SyncKey(ctx context.Context, k optimistic.KeyState) error {
	return s.direct.SyncKey(ctx, k)
}

// Inspect reads the live state of each key in one pipelined round trip, as
// optimistic.Store.Inspect does.
func (s *Store) Inspect(ctx context.Context, keyIDs ...string) ([]optimistic.KeyInfo, error) {
	return s.direct.Inspect(ctx, keyIDs...)
}

// Holds reads whether ref holds a live lease with the optimistic store's
// commands: a read needs no script.
func (s *Store) Holds(ctx context.Context, ref optimistic.LeaseRef) (time.Time, error) {
	return s.direct.Holds(ctx, ref)
}

// Ping checks that Redis answers, as optimistic.Store.Ping does.
func (s *Store) Ping(ctx context.Context) error { return s.direct.Ping(ctx) }
