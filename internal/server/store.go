package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/credpool/credpool/internal/broker"
	rs "github.com/credpool/credpool/internal/redisschema"
	"github.com/credpool/credpool/internal/requestlog"
	"github.com/credpool/credpool/internal/sqlitestore"
	"github.com/credpool/credpool/optimistic"
)

// The Redis client's bounds, where the URL does not set its own
// (dial_timeout, read_timeout, write_timeout, pool_timeout, max_retries,
// and dialer_retries for a cluster). A Redis that goes silent (a network
// that drops packets without a reset) must become a store error, 503
// store_unavailable, well inside a request's deadline rather than run it
// out: a try is bounded by redisTimeout, and a call by its retries.
const (
	redisTimeout = time.Second
	// redisRetries is how many more times go-redis tries a command after a
	// network error or a timeout.
	redisRetries = 1
	// redisDialAttempts is how many times go-redis dials a connection.
	redisDialAttempts = 1
	// redisPoolTimeout bounds the wait for a pooled connection: every WATCH
	// transaction holds one, and a saturated pool must turn into a quick
	// 503, not a hang.
	redisPoolTimeout = time.Second
)

// errBadURL stands for any parse error of the Redis URL, which may carry
// a password that an error must not echo.
var errBadURL = errors.New("not a valid Redis URL, want redis://[user:password@]host:port[/db]")

// leaseStore is the active lease store and its request log.
type leaseStore struct {
	name string
	// id names this store in the catalog's record of synced keys: the id
	// the store keeps (a Redis key, a row of the file), and the name
	// releases before it derived from the store's address.
	id       *broker.StoreID
	leases   optimistic.LeaseStore
	requests broker.RequestLog
	// nodes is the last check of the store's servers (see nodeWatch).
	nodes func() []optimistic.NodeHealth
	close func()
}

// openStore picks the lease store: WATCH/MULTI on Redis when a URL is
// given, else SQLite in the catalog's file.
func openStore(ctx context.Context, cfg Config) (leaseStore, error) {
	if cfg.RedisURL == "" {
		s, err := sqlitestore.New(ctx, cfg.DB, nil)
		if err != nil {
			return leaseStore{}, err
		}
		requests, err := requestlog.NewSQLite(ctx, cfg.DB)
		if err != nil {
			_ = s.Close()
			return leaseStore{}, err
		}
		id := broker.NewStoreID(ctx, s, cfg.Logger, legacySQLiteID)
		w := watchNodes(s, 0, cfg.Logger) // every DefaultClusterRefresh
		return leaseStore{name: "sqlite", id: id, leases: s, requests: requests, nodes: w.Nodes,
			close: func() { w.stop(); _ = s.Close() }}, nil
	}
	from := cmp.Or(cfg.RedisURLFrom, "--redis")
	rdb, legacyID, err := redisClient(cfg.RedisURL, cfg.RedisCluster)
	if err != nil {
		return leaseStore{}, fmt.Errorf("%s: %w", from, err)
	}
	closeClient := func() { _ = rdb.Close() }
	if c, ok := rdb.(*redis.ClusterClient); ok {
		// Its slot map is kept fresh from the first command on.
		stop := KeepTopology(c, cfg.RedisClusterRefresh)
		closeClient = func() { stop(); _ = c.Close() }
	}
	s, err := optimistic.New(rdb, &optimistic.Options{MinReplicas: cfg.MinReplicas, LostHold: cfg.MaxLease})
	if err != nil {
		closeClient()
		return leaseStore{}, err
	}
	// On a cluster, one master answering is enough to start: the keys on
	// the others wait for them.
	if err := s.Ping(ctx); err != nil {
		closeClient()
		return leaseStore{}, pingErr(from, rdb, err)
	}
	// The request log lives beside the leases, under the store's prefix.
	requests, err := requestlog.NewRedis(rdb, rs.DefaultPrefix)
	if err != nil {
		closeClient()
		return leaseStore{}, err
	}
	id := broker.NewStoreID(ctx, newRedisIDs(rdb, rs.DefaultPrefix), cfg.Logger, legacyID)
	w := watchNodes(s, cfg.RedisClusterRefresh, cfg.Logger)
	return leaseStore{name: "redis", id: id, leases: s, requests: requests, nodes: w.Nodes,
		close: func() { w.stop(); closeClient() }}, nil
}

// pingErr says why the first ping of rdb, the Redis whose URL came from
// from (a flag or a variable), failed: a server that answered with an
// error is reachable, and its answer says what to fix.
func pingErr(from string, rdb redis.UniversalClient, err error) error {
	var reply redis.Error
	switch {
	case errors.Is(err, redis.Nil):
		// Only a sentinel answers nil there: it knows no such master.
		return fmt.Errorf("redis at %s: %w", from, errNoSuchMaster)
	case redis.HasErrorPrefix(err, "DB index is out of range"):
		var db int
		if c, ok := rdb.(*redis.Client); ok {
			db = c.Options().DB
		}
		return fmt.Errorf("redis at %s has no database %d (the URL's /%d; the server's databases setting is lower): %w", from, db, db, err)
	case errors.As(err, &reply):
		return fmt.Errorf("redis at %s answered but refused the connection: %w", from, err)
	}
	return fmt.Errorf("redis at %s is not reachable: %w", from, err)
}

// redisClient returns a client of the Redis at raw, bounded as the
// constants above say, and the name releases before store ids gave the
// store (see legacy IDs below).
func redisClient(raw string, cluster bool) (redis.UniversalClient, string, error) {
	if isSentinelURL(raw) {
		if cluster {
			return nil, "", errSentinelCluster
		}
		return sentinelClient(raw)
	}
	if cluster {
		o, err := redis.ParseClusterURL(raw)
		if err != nil {
			return nil, "", errBadURL
		}
		bound(&o.ContextTimeoutEnabled, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout, &o.MaxRetries, &o.DialerRetries)
		return redis.NewClusterClient(o), clusterID(o), nil
	}
	o, err := redis.ParseURL(raw)
	if err != nil {
		return nil, "", errBadURL
	}
	bound(&o.ContextTimeoutEnabled, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout, &o.MaxRetries, &o.DialerRetries)
	return redis.NewClient(o), redisID(o), nil
}

// bound sets a Redis client's options to the bounds above where the URL
// set none (a zero counts as unset); the write timeout follows the read
// timeout. Cluster, standalone and Sentinel options spell the same fields
// in three types, hence the pointers.
func bound(ctxTimeout *bool, dial, read, write, pool *time.Duration, retries, dialAttempts *int) {
	*ctxTimeout = true
	*dial = cmp.Or(*dial, redisTimeout)
	*read = cmp.Or(*read, redisTimeout)
	*write = cmp.Or(*write, *read)
	*pool = cmp.Or(*pool, redisPoolTimeout)
	*retries = cmp.Or(*retries, redisRetries)
	*dialAttempts = cmp.Or(*dialAttempts, redisDialAttempts)
}

// legacySQLiteID is the name releases before store ids gave the SQLite
// store. The catalogs that hold it kept the store in their own file, as
// this release does: it names this store.
const legacySQLiteID = "sqlite"

// A release before store ids named a Redis store by its address, so a
// catalog may still mark keys with such a name. The Redis at the same
// address (as this instance spells it) counts as this store, so an
// upgrade holds no key back, and the first sync marks every key with the
// store's own id. (Two spellings of one address were two stores then: a
// key the other spelling marked last is held back once after the
// upgrade.)
//
// redisID names a Redis by its address and database as parsed, however
// the URL spells them (a default port or database, client_name, timeouts),
// and without credentials: rotating a password is no move to another
// store.
func redisID(o *redis.Options) string {
	if o.Network == "unix" {
		return fmt.Sprintf("redis unix:%s/%d", o.Addr, o.DB)
	}
	return fmt.Sprintf("redis redis://%s/%d", strings.ToLower(o.Addr), o.DB)
}

// clusterID names a cluster by its seed addresses, in any order.
func clusterID(o *redis.ClusterOptions) string {
	addrs := make([]string, len(o.Addrs))
	for i, a := range o.Addrs {
		addrs[i] = strings.ToLower(a)
	}
	slices.Sort(addrs)
	return "redis cluster " + strings.Join(slices.Compact(addrs), ",")
}
