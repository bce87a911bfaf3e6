package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/credpool/credpool/bench/baseline"
	"github.com/credpool/credpool/internal/redisproc"
	"github.com/credpool/credpool/internal/sqlitestore"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
)

// Strategy is a kind of lease store the harness measures.
type Strategy struct {
	Name string
	// Redis says the store keeps its state in Redis, where the harness
	// counts the commands it sends; otherwise it keeps it in a SQLite file.
	Redis bool
	// Open returns a store over t. It must keep all its state under t's
	// prefix (Redis) or in t's file (SQLite).
	Open func(ctx context.Context, t Target) (optimistic.LeaseStore, error)
}

// Target is where one run keeps its state: a key space nobody else uses.
type Target struct {
	// Redis and Prefix are set for Redis strategies.
	Redis  redis.UniversalClient
	Prefix string
	// DB is set for SQLite strategies: a file of its own.
	DB *sqlitex.DB
}

// Strategies returns the lease stores credpool ships, in report order: a
// new slice each call, so no caller can change another's. The Redis stores
// come with and without the per-key turn in each process (the gate, see
// internal/keygate): "optimistic" (gate on, its default) and
// "optimistic-nogate"; "lua" (the seed, no gate) and "lua+gate".
func Strategies() []Strategy {
	return []Strategy{
		{Name: "optimistic", Redis: true, Open: func(_ context.Context, t Target) (optimistic.LeaseStore, error) {
			return optimistic.New(t.Redis, &optimistic.Options{Prefix: t.Prefix})
		}},
		{Name: "optimistic-nogate", Redis: true, Open: func(_ context.Context, t Target) (optimistic.LeaseStore, error) {
			return optimistic.New(t.Redis, &optimistic.Options{Prefix: t.Prefix, NoGate: true})
		}},
		{Name: "lua", Redis: true, Open: func(_ context.Context, t Target) (optimistic.LeaseStore, error) {
			return baseline.New(t.Redis, &baseline.Options{Prefix: t.Prefix})
		}},
		{Name: "lua+gate", Redis: true, Open: func(_ context.Context, t Target) (optimistic.LeaseStore, error) {
			return baseline.New(t.Redis, &baseline.Options{Prefix: t.Prefix, Gate: true})
		}},
		{Name: "sqlite", Open: func(ctx context.Context, t Target) (optimistic.LeaseStore, error) {
			return sqlitestore.New(ctx, t.DB, nil)
		}},
	}
}

// Select returns the strategies of from named in a comma-separated list,
// in the list's order.
func Select(from []Strategy, names string) ([]Strategy, error) {
	var out []Strategy
	for name := range strings.SplitSeq(names, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(from, func(s Strategy) bool { return s.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("bench: unknown strategy %q (have %s)", name, strategyNames(from))
		}
		if slices.ContainsFunc(out, func(s Strategy) bool { return s.Name == name }) {
			return nil, fmt.Errorf("bench: strategy %q listed twice", name)
		}
		out = append(out, from[i])
	}
	return out, nil
}

func strategyNames(ss []Strategy) string {
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = s.Name
	}
	return strings.Join(names, ", ")
}

// location says where a run's state lives, in a form a worker process can
// receive as JSON and connect to.
type location struct {
	RedisURL string `json:",omitempty"`
	// Cluster says RedisURL is a Redis Cluster's.
	Cluster bool   `json:",omitempty"`
	Prefix  string `json:",omitempty"`
	Path    string `json:",omitempty"`
	// PoolSize sizes the Redis connection pool: one connection per caller,
	// since a WATCH transaction holds one for its whole life.
	PoolSize int `json:",omitempty"`
}

// conn is an open store with its connection.
type conn struct {
	store  optimistic.LeaseStore
	target Target
	// roundTrips counts requests sent to Redis: a command or a whole
	// pipeline is one; a connection's set-up is not counted. Zero for
	// SQLite.
	roundTrips *redisproc.RoundTrips
	close      func() error
}

// open connects to l and opens s's store there.
func (l location) open(ctx context.Context, s Strategy) (*conn, error) {
	c := &conn{roundTrips: &redisproc.RoundTrips{}}
	if s.Redis {
		rdb, err := l.redis(c.roundTrips)
		if err != nil {
			return nil, err
		}
		c.target, c.close = Target{Redis: rdb, Prefix: l.Prefix}, rdb.Close
	} else {
		db, err := sqlitex.Open(l.Path)
		if err != nil {
			return nil, err
		}
		c.target, c.close = Target{DB: db}, db.Close
	}
	store, err := s.Open(ctx, c.target)
	if err != nil {
		_ = c.close()
		return nil, fmt.Errorf("bench: open %s store: %w", s.Name, err)
	}
	c.store = store
	return c, nil
}

// redis returns a client of l's Redis that counts its round trips in rt,
// but for those that set up a connection (countedRoundTrips). On a cluster
// the nodes count them: a transaction runs on a node's client, and a
// pipeline split over n nodes is n round trips.
func (l location) redis(rt *redisproc.RoundTrips) (redis.UniversalClient, error) {
	if l.Cluster {
		opt, err := redis.ParseClusterURL(l.RedisURL)
		if err != nil {
			return nil, fmt.Errorf("bench: redis cluster url: %w", err)
		}
		opt.PoolSize = l.PoolSize
		rdb := redis.NewClusterClient(opt)
		rdb.OnNewNode(func(node *redis.Client) { node.AddHook(countedRoundTrips{rt}) })
		return rdb, nil
	}
	opt, err := redis.ParseURL(l.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("bench: redis url: %w", err)
	}
	opt.PoolSize = l.PoolSize
	rdb := redis.NewClient(opt)
	rdb.AddHook(countedRoundTrips{rt})
	return rdb, nil
}
