// Package server assembles credpool's service from its parts: the catalog,
// the lease store (Redis or the catalog's SQLite file) with its request
// log, the broker, its admin and the HTTP handlers. "credpool serve" and
// the end-to-end tests build the service through New, so the tests run
// what production runs; the binary adds flags, keys and the HTTP server.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/credpool/credpool/handlers"
	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/postgres"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
)

// Config is what New needs. One of DB and Postgres, Sealer and the two
// keys are required; the rest have defaults.
type Config struct {
	// DB is the catalog's SQLite database, also the lease store's when
	// RedisURL is empty. The caller opens it and closes it after Close.
	DB *sqlitex.DB
	// Postgres, instead of DB, holds the catalog in PostgreSQL, which
	// instances on several hosts share; the leases then live in Redis
	// (RedisURL is required). The caller opens it and closes it after
	// Close.
	Postgres *postgres.DB
	// Sealer seals the credentials at rest in the catalog.
	Sealer *catalog.Sealer
	// RedisURL, if set, keeps leases in Redis (WATCH/MULTI), e.g.
	// redis://[user:password@]host:port[/db], or the master that Sentinel
	// names, redis+sentinel://[user:password@]host:port[,host:port...]/master[/db];
	// the client's timeouts are redisTimeout's unless the URL sets its own.
	//
	// default: "" (leases in DB)
	RedisURL string
	// RedisURLFrom names where RedisURL came from (a flag, or the
	// environment variable it was read from), for the errors about it.
	//
	// default: "--redis"
	RedisURLFrom string
	// RedisCluster reads RedisURL as a cluster URL
	// (redis://host:port?addr=host2:port2).
	//
	// default: false
	RedisCluster bool
	// RedisClusterRefresh is how often a cluster client reloads its slot
	// map; it also reloads it as soon as a node stops answering (see
	// KeepTopology). After a failover, a master's keys grant again within
	// about this long of its replica's promotion. It is also how often
	// the Redis servers are checked, with a write each, for /readyz and
	// the metrics (and a node going down or coming back is logged),
	// cluster or not; the SQLite store is checked every second.
	//
	// default: DefaultClusterRefresh (1s)
	RedisClusterRefresh time.Duration
	// MinReplicas is the Redis store's optimistic.Options.MinReplicas.
	//
	// default: 0
	MinReplicas int
	// InternalKey and AdminKey guard the two APIs (handlers.Config).
	InternalKey, AdminKey string
	// Weights rank candidates.
	//
	// default: broker.DefaultWeights()
	Weights *broker.Weights
	// Pools is the pool fallback order.
	//
	// default: broker.DefaultPoolOrder()
	Pools broker.PoolOrder
	// Inspect is broker.Options.Inspect: how many candidates per allocate
	// have their live state read from the store.
	//
	// default: broker.DefaultInspect; negative: all
	Inspect int
	// LiveMaxAge is broker.Options.LiveMaxAge: how long a key's live
	// state, once read, ranks it without another read.
	//
	// default: broker.DefaultLiveMaxAge; negative: read on every allocate
	LiveMaxAge time.Duration
	// MaxLease is the longest lease granted or renewed to, and how long a
	// key the store lost is held back; the broker, the handlers and the
	// Redis store (optimistic.Options.LostHold) get the same.
	//
	// default: broker.DefaultMaxLease
	MaxLease time.Duration
	// RequestTimeout bounds each request's work (handlers.Config).
	//
	// default: 10s
	RequestTimeout time.Duration
	// Logger gets the broker's and the handlers' lines.
	//
	// default: slog.Default()
	Logger *slog.Logger
	// LogDropped, if set, says how many log lines were dropped so far
	// (see logqueue), for the metrics.
	LogDropped func() int64
	// WrapCatalog and WrapLeases, if set, wrap what the broker's request
	// path sees of the catalog and the lease store (not the admin's): the
	// tests inject faults and pauses with them.
	//
	// default: nil
	WrapCatalog func(broker.Catalog) broker.Catalog
	WrapLeases  func(optimistic.LeaseStore) optimistic.LeaseStore
}

// Server is the assembled service. Its methods are safe for concurrent
// use; Close it when its Handler serves no more (calls after the first do
// nothing).
type Server struct {
	// Handler serves the HTTP API.
	Handler http.Handler
	// Catalog and Admin are the service's own, for seeding and inspection.
	Catalog *catalog.SQL
	Admin   *broker.Admin
	// StoreName names the lease store: "redis" or "sqlite".
	StoreName string

	broker     *broker.Broker
	cache      *catalog.Cache
	log        *slog.Logger
	closeStore func()
	closeOnce  sync.Once
}

// New opens the catalog in cfg.DB or cfg.Postgres, seals with the current
// key any secret not yet sealed with it (or fails with catalog.ErrWrongKey
// if the catalog's sealed secrets were all sealed with other keys), opens
// the lease store, syncs the catalog into it and builds the handlers. On
// failure nothing stays open but the caller's database.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if (cfg.DB == nil) == (cfg.Postgres == nil) || cfg.Sealer == nil {
		return nil, errors.New("server: one of DB and Postgres, and Sealer, are required")
	}
	if cfg.Postgres != nil && cfg.RedisURL == "" {
		return nil, errors.New("server: a PostgreSQL catalog needs a Redis URL: the SQLite lease store lives in the SQLite catalog's file")
	}
	if err := cfg.Pools.Check(); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxLease <= 0 {
		cfg.MaxLease = broker.DefaultMaxLease
	}
	cat, err := openCatalog(ctx, cfg)
	if err != nil {
		return nil, err
	}
	// Secrets written in the clear, or sealed with a key being rotated out,
	// are sealed with the current key now.
	sealed, skipped, err := cat.Rekey(ctx)
	if err != nil {
		return nil, fmt.Errorf("seal secrets with the current key: %w", err)
	}
	if sealed > 0 {
		cfg.Logger.Info("secrets sealed with the current key", "count", sealed)
	}
	if len(skipped) > 0 {
		// Those keys answer 503 catalog_unavailable until a key that opens
		// them is configured (CREDPOOL_SECRET_KEYS_OLD) or they are put again.
		cfg.Logger.Warn("secrets no configured key opens were left as they are", "key_ids", skipped)
	}
	st, err := openStore(ctx, cfg)
	if err != nil {
		return nil, err
	}
	opts := &broker.Options{
		Weights: cfg.Weights, Pools: cfg.Pools, Inspect: cfg.Inspect, LiveMaxAge: cfg.LiveMaxAge, Requests: st.requests, Logger: cfg.Logger,
		MaxLease: cfg.MaxLease, Losses: broker.NewLosses(), StoreID: st.id,
	}
	admin := broker.NewAdmin(cat, st.leases, opts)
	n, err := admin.Sync(ctx)
	if err != nil {
		st.close()
		return nil, fmt.Errorf("sync catalog into the %s lease store: %w", st.name, err)
	}
	cfg.Logger.Info("catalog synced into the lease store", "keys", n)

	cache, err := catalog.NewCache(ctx, cat, &catalog.CacheOptions{Logger: cfg.Logger})
	if err != nil {
		st.close()
		return nil, err
	}
	var brokerCat broker.Catalog = cache
	if cfg.WrapCatalog != nil {
		brokerCat = cfg.WrapCatalog(brokerCat)
	}
	leases := st.leases
	if cfg.WrapLeases != nil {
		leases = cfg.WrapLeases(leases)
	}
	brk := broker.New(brokerCat, leases, opts)
	h, err := handlers.New(handlers.Config{
		Service:        brk,
		Admin:          admin,
		InternalKey:    cfg.InternalKey,
		AdminKey:       cfg.AdminKey,
		Store:          st.name,
		Nodes:          st.nodes,
		Metrics:        handlers.NewMetrics(),
		RequestTimeout: cfg.RequestTimeout,
		MaxLease:       cfg.MaxLease,
		Logger:         cfg.Logger,
		LogDropped:     cfg.LogDropped,
	})
	if err != nil {
		brk.Close(ctx)
		_ = cache.Close(ctx)
		st.close()
		return nil, err
	}
	return &Server{Handler: h, Catalog: cat, Admin: admin, StoreName: st.name, broker: brk, cache: cache, log: cfg.Logger, closeStore: st.close}, nil
}

// Close writes the uses the catalog cache holds (counters and last use)
// and, at the same time, gives the releases that met a store failure one
// last try, both under ctx; then it closes the lease store's client.
// Releases still failing are left to expire (see Backlog); uses that
// cannot be written are logged as lost.
func (s *Server) Close(ctx context.Context) {
	s.closeOnce.Do(func() {
		// At once: a catalog that hangs, or a silent Redis, may take the
		// whole of ctx, and neither needs the other (on a Redis store; the
		// SQLite store shares the catalog's file and its write lock).
		var wg sync.WaitGroup
		wg.Go(func() {
			if err := s.cache.Close(ctx); err != nil {
				s.log.Warn("catalog: uses of the last moments not written", "err", err)
			}
		})
		wg.Go(func() { s.broker.Close(ctx) })
		wg.Wait()
		s.closeStore()
	})
}

// StopWaiting ends the waits of allocate requests for a slot, as the
// service begins to shut down (see broker.Broker.StopWaiting): each is
// answered 503 shutting_down, holding no slot, unless it was granted
// first. Other requests are left to finish.
func (s *Server) StopWaiting() { s.broker.StopWaiting() }

// Backlog reports the releases that met a store failure and wait for it.
func (s *Server) Backlog() broker.Backlog { return s.broker.Backlog() }

// openCatalog opens the catalog in cfg.Postgres if set, else in cfg.DB.
func openCatalog(ctx context.Context, cfg Config) (*catalog.SQL, error) {
	opts := &catalog.Options{Sealer: cfg.Sealer}
	if cfg.Postgres != nil {
		return catalog.NewPostgres(ctx, cfg.Postgres, opts)
	}
	return catalog.New(ctx, cfg.DB, opts)
}
