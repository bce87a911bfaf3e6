package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/credpool/credpool/handlers"
	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/logqueue"
	"github.com/credpool/credpool/internal/postgres"
	"github.com/credpool/credpool/internal/server"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
)

type serveConfig struct {
	listen       string
	redisURL     string
	redisCluster bool
	db           string
	internalKey  string
	adminKey     string
	weights      string
	fallback     string
	dev          bool
	demo         bool
	readTimeout  time.Duration
	reqTimeout   time.Duration
	idleTimeout  time.Duration
	maxLease     time.Duration
	minReplicas  int
	inspect      int
	liveMaxAge   time.Duration

	// clusterRefresh is server.Config.RedisClusterRefresh.
	clusterRefresh time.Duration

	// env names, by flag, the variable a value was read from: the flags
	// not given on the command line whose variable is set.
	env map[string]string
}

// name is how an error names flag: by its variable if the value came
// from the environment, which is where the operator has to fix it.
func (c serveConfig) name(flag string) string {
	if v, ok := c.env[flag]; ok {
		return v + " (for --" + flag + ")"
	}
	return "--" + flag
}

// serveEnv names each flag's environment fallback, applied to the flags
// the command line (which wins) does not give, and parsed as the flag is.
var serveEnv = []struct{ flag, env string }{
	{"listen", "CREDPOOL_LISTEN"},
	{"redis", "CREDPOOL_REDIS_URL"},
	{"redis-cluster", "CREDPOOL_REDIS_CLUSTER"},
	{"redis-cluster-refresh", "CREDPOOL_REDIS_CLUSTER_REFRESH"},
	{"db", "CREDPOOL_DB"},
	{"internal-key", "CREDPOOL_INTERNAL_KEY"},
	{"admin-key", "CREDPOOL_ADMIN_KEY"},
	{"weights", "CREDPOOL_WEIGHTS"},
	{"pool-fallback", "CREDPOOL_POOL_FALLBACK"},
	{"read-timeout", "CREDPOOL_READ_TIMEOUT"},
	{"request-timeout", "CREDPOOL_REQUEST_TIMEOUT"},
	{"idle-timeout", "CREDPOOL_IDLE_TIMEOUT"},
	{"max-lease", "CREDPOOL_MAX_LEASE"},
	{"redis-min-replicas", "CREDPOOL_REDIS_MIN_REPLICAS"},
	{"inspect", "CREDPOOL_INSPECT"},
	{"live-max-age", "CREDPOOL_LIVE_MAX_AGE"},
}

func parseServe(args []string) (serveConfig, error) {
	var c serveConfig
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "address to listen on (env CREDPOOL_LISTEN)")
	fs.StringVar(&c.redisURL, "redis", "", "Redis URL, e.g. redis://127.0.0.1:6379/0, or Sentinel: redis+sentinel://host:26379[,host:port...]/master[/db]; empty: leases live in the SQLite file (env CREDPOOL_REDIS_URL)")
	fs.BoolVar(&c.redisCluster, "redis-cluster", false, "treat --redis as a cluster URL (redis://host:port?addr=host2:port2) (env CREDPOOL_REDIS_CLUSTER=true)")
	fs.DurationVar(&c.clusterRefresh, "redis-cluster-refresh", server.DefaultClusterRefresh, "how often a --redis-cluster client reloads the cluster's slot map; it also does as soon as a node stops answering (env CREDPOOL_REDIS_CLUSTER_REFRESH)")
	fs.StringVar(&c.db, "db", "credpool.db", "key catalog: a SQLite file, or a PostgreSQL URL (postgres://user:password@host:port/database) that instances on several hosts share, which needs --redis (env CREDPOOL_DB)")
	fs.StringVar(&c.internalKey, "internal-key", "", "secret callers send as X-Internal-Key (env CREDPOOL_INTERNAL_KEY)")
	fs.StringVar(&c.adminKey, "admin-key", "", "secret admins send as X-Admin-Key (env CREDPOOL_ADMIN_KEY)")
	fs.StringVar(&c.weights, "weights", "", "ranking weights to override, e.g. capacity=1,idle=0.3,jitter=0.01 (env CREDPOOL_WEIGHTS)")
	fs.StringVar(&c.fallback, "pool-fallback", "vip=default", "one-way pool borrowing, e.g. vip=default;gold=silver+default (env CREDPOOL_POOL_FALLBACK)")
	fs.BoolVar(&c.dev, "dev", false, "development mode: generate missing internal/admin keys and print them once")
	fs.BoolVar(&c.demo, "demo", false, "seed a small demo pool into an empty catalog (fake secrets)")
	fs.DurationVar(&c.readTimeout, "read-timeout", 10*time.Second, "longest a client may take to send a whole request, body included (env CREDPOOL_READ_TIMEOUT)")
	fs.DurationVar(&c.reqTimeout, "request-timeout", 10*time.Second, "longest one request's work may take, store and catalog retries included; a 1,000-key bulk put on a slow disk may need more (env CREDPOOL_REQUEST_TIMEOUT)")
	fs.DurationVar(&c.idleTimeout, "idle-timeout", 60*time.Second, "longest an idle keep-alive connection stays open (env CREDPOOL_IDLE_TIMEOUT)")
	fs.DurationVar(&c.maxLease, "max-lease", broker.DefaultMaxLease, "longest lease granted or renewed to; also how long a key the lease store lost is held back (env CREDPOOL_MAX_LEASE)")
	fs.IntVar(&c.minReplicas, "redis-min-replicas", 0, "replicas that must acknowledge a grant or renewal (WAIT); 0: none; needs --redis (env CREDPOOL_REDIS_MIN_REPLICAS)")
	fs.IntVar(&c.inspect, "inspect", broker.DefaultInspect, "candidates per allocate, the best by the catalog, ranked again with their live state from the store (see --live-max-age); 0: all (env CREDPOOL_INSPECT)")
	fs.DurationVar(&c.liveMaxAge, "live-max-age", broker.DefaultLiveMaxAge, "how long a key's live state, once read, ranks it without another read, kept up by this instance's own grants and releases (then read again in the background, and before it ranks once four times older); 0: read on every allocate (env CREDPOOL_LIVE_MAX_AGE)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	c.env = map[string]string{}
	for _, e := range serveEnv {
		v, ok := os.LookupEnv(e.env)
		if !ok || given[e.flag] {
			continue
		}
		c.env[e.flag] = e.env
		if err := fs.Set(e.flag, v); err != nil {
			if g, ok := fs.Lookup(e.flag).Value.(flag.Getter); ok {
				if _, isDuration := g.Get().(time.Duration); isDuration {
					err = fmt.Errorf("%w: want a duration with its unit, e.g. 10s or 500ms", err)
				}
			}
			return c, fmt.Errorf("serve: %s: %w", c.name(e.flag), err)
		}
	}
	if c.listen == "" {
		// net.Listen would take it for every interface, on a random port:
		// an unset variable in a unit file must not expose the service.
		return c, fmt.Errorf("serve: %s is empty: want host:port, e.g. 127.0.0.1:8080, or :8080 for every interface", c.name("listen"))
	}
	for _, d := range []struct {
		flag string
		val  time.Duration
	}{{"read-timeout", c.readTimeout}, {"request-timeout", c.reqTimeout}, {"idle-timeout", c.idleTimeout}, {"redis-cluster-refresh", c.clusterRefresh}} {
		if d.val <= 0 {
			return c, fmt.Errorf("serve: %s must be positive", c.name(d.flag))
		}
	}
	if c.maxLease < time.Second || c.maxLease > catalog.ReportMemory {
		return c, fmt.Errorf("serve: %s must be from 1s to %v", c.name("max-lease"), catalog.ReportMemory)
	}
	if c.minReplicas < 0 {
		return c, fmt.Errorf("serve: %s must be 0 or more", c.name("redis-min-replicas"))
	}
	if c.inspect < 0 {
		return c, fmt.Errorf("serve: %s must be 0 (all) or more", c.name("inspect"))
	}
	if c.liveMaxAge < 0 {
		return c, fmt.Errorf("serve: %s must be 0 (read on every allocate) or more", c.name("live-max-age"))
	}
	if err := postgres.CheckTarget(c.db); err != nil {
		return c, fmt.Errorf("serve: %s %w", c.name("db"), err)
	}
	if c.redisCluster && c.redisURL == "" {
		return c, fmt.Errorf("serve: %s needs --redis: it says how to read the Redis URL", c.name("redis-cluster"))
	}
	if postgres.IsURL(c.db) && c.redisURL == "" {
		return c, fmt.Errorf("serve: a PostgreSQL %s needs --redis: leases live in Redis when the catalog is shared (the SQLite lease store lives in a SQLite catalog's file)", c.name("db"))
	}
	if c.minReplicas > 0 && c.redisURL == "" {
		return c, fmt.Errorf("serve: %s needs --redis: the SQLite store has no replicas", c.name("redis-min-replicas"))
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	return c, nil
}

func serve(args []string) error {
	cfg, err := parseServe(args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	// A log reader that goes away (a pipe's) must not kill the service
	// mid-request: a write to stderr fails (EPIPE) instead of SIGPIPE.
	signal.Ignore(syscall.SIGPIPE)
	// Nor may one that stalls hold up a request: lines are queued, and
	// dropped (counted) when the queue is full.
	logs := logqueue.New(os.Stderr, logQueue)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		_ = logs.Flush(ctx)
	}()
	log := slog.New(slog.NewJSONHandler(logs, nil))
	// go-redis logs every failed dial of its own (many a second while a
	// node is down); the service logs a node going down once instead.
	redis.SetLogger(redisLog{log})
	ctx, unwatch := watchSignals()
	defer unwatch()
	if err := run(ctx, cfg, log, logs.Dropped); err != nil {
		return err
	}
	// Drained, the last releases tried, the stores closed: what a
	// supervisor waits for to know the stop was clean.
	log.Info("credpool stopped", "signal", signalName(ctx))
	return nil
}

// run starts the service and serves until ctx ends, then drains it. A
// signal (ctx's *interrupted cause) stops it cleanly, with nil, while it
// starts too: a step that failed meanwhile failed of the signal (a store
// dial or a migration cut short) or no longer matters.
func run(ctx context.Context, cfg serveConfig, log *slog.Logger, logDropped func() int64) error {
	startFailed := func(err error) error {
		if name := signalName(ctx); name != "" {
			// What the start was doing says why it took long enough
			// to be stopped (a silent store, a locked migration).
			log.Info("stopped while starting: not serving", "signal", name, "during", err.Error())
			return nil
		}
		return err
	}
	if err := ensureKeys(&cfg); err != nil {
		return err
	}
	weights, err := parseWeights(cfg.weights)
	if err != nil {
		return fmt.Errorf("%s: %w", cfg.name("weights"), err)
	}
	pools, err := parsePoolOrder(cfg.fallback)
	if err != nil {
		return fmt.Errorf("%s: %w", cfg.name("pool-fallback"), err)
	}
	sealer, err := secretSealer(cfg)
	if err != nil {
		return err
	}
	sqliteDB, pgDB, err := openCatalogDB(ctx, cfg.db)
	if err != nil {
		return startFailed(fmt.Errorf("%s: %w", cfg.name("db"), err))
	}
	defer func() {
		if sqliteDB != nil {
			_ = sqliteDB.Close()
		} else {
			_ = pgDB.Close()
		}
	}()
	app, err := server.New(ctx, server.Config{
		DB: sqliteDB, Postgres: pgDB, Sealer: sealer,
		RedisURL: cfg.redisURL, RedisURLFrom: cfg.name("redis"), RedisCluster: cfg.redisCluster, RedisClusterRefresh: cfg.clusterRefresh, MinReplicas: cfg.minReplicas,
		InternalKey: cfg.internalKey, AdminKey: cfg.adminKey, Inspect: inspect(cfg.inspect),
		LiveMaxAge: liveMaxAge(cfg.liveMaxAge),
		Weights:    &weights, Pools: pools, MaxLease: cfg.maxLease, RequestTimeout: cfg.reqTimeout,
		Logger: log, LogDropped: logDropped,
	})
	if errors.Is(err, catalog.ErrWrongKey) && cfg.dev && os.Getenv("CREDPOOL_SECRET_KEY") == "" {
		return fmt.Errorf("%w: the key is --dev's %s: put back the file that sealed them, or set CREDPOOL_SECRET_KEY to their key", err, cfg.db+".key")
	}
	if errors.Is(err, catalog.ErrWrongKey) {
		return fmt.Errorf("%w: set CREDPOOL_SECRET_KEY to the key that sealed them, the same on every instance sharing the catalog (while rotating, that key may be in CREDPOOL_SECRET_KEYS_OLD)", err)
	}
	if err != nil {
		return startFailed(err)
	}
	defer func() {
		// Releases that met a store failure get one last try, with time of
		// their own: draining may have used up all of its.
		closing, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		app.Close(closing)
		if b := app.Backlog(); b.Pending > 0 {
			log.Warn("releases left to expire", "count", b.Pending)
		}
	}()
	if cfg.demo {
		n, err := seedDemo(ctx, app.Catalog, app.Admin)
		if err != nil {
			return startFailed(err)
		}
		if n > 0 {
			log.Info("demo pool seeded", "keys", n, "alias", "openai/gpt-4o")
		}
	}
	if ctx.Err() != nil {
		// A signal that came during a step that does not watch ctx.
		return startFailed(ctx.Err())
	}
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return err
	}
	srv := httpServer(app.Handler, cfg)
	log.Info("credpool serving", "addr", ln.Addr().String(), "lease_store", app.StoreName, "catalog", postgres.Redact(cfg.db))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	drain := drainFor(cfg.reqTimeout)
	log.Info("shutting down: draining requests", "within", drain.String(), "signal", signalName(ctx))
	// Requests waiting for a slot are answered now (503 shutting_down),
	// not when their waits run out: their callers go to another instance
	// at once, and the drain does not last as long as the longest wait.
	app.StopWaiting()
	shutdown, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return fmt.Errorf("requests still running after %s were cut: %w", drain, err)
	}
	return nil
}

// watchSignals returns a ctx that the first SIGINT or SIGTERM ends, with
// an *interrupted cause; the signals then get their default action back,
// so that a second one stops the process at once. unwatch stops watching.
func watchSignals() (ctx context.Context, unwatch func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-sigs:
			signal.Stop(sigs)
			cancel(&interrupted{sig})
		case <-done:
		}
	}()
	return ctx, sync.OnceFunc(func() {
		signal.Stop(sigs)
		close(done)
		cancel(nil)
	})
}

// signalName names the signal that ended ctx (see watchSignals), or is
// "" if none did.
func signalName(ctx context.Context) string {
	var sig *interrupted
	if errors.As(context.Cause(ctx), &sig) {
		return sig.name()
	}
	return ""
}

// At shutdown, drainTimeout bounds waiting for requests in flight (or
// the request timeout and a margin, if longer), then closeTimeout the last
// try of the releases kept for a failed store, and the log's last lines.
// logQueue is how many log lines wait for a slow reader before more are
// dropped.
const (
	drainTimeout = 15 * time.Second
	closeTimeout = 5 * time.Second
	logQueue     = 4096
)

// drainFor is how long the drain at shutdown waits for requests in
// flight, which may each run for reqTimeout.
func drainFor(reqTimeout time.Duration) time.Duration {
	return max(drainTimeout, reqTimeout+closeTimeout)
}

// httpServer bounds what a client can hold: the whole request must arrive
// within the read timeout (a slow body is cut off), the answer is written
// within the request's own deadline plus a margin, and an idle keep-alive
// connection is closed after the idle timeout.
func httpServer(h http.Handler, cfg serveConfig) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: min(cfg.readTimeout, 5*time.Second),
		ReadTimeout:       cfg.readTimeout,
		WriteTimeout:      cfg.readTimeout + cfg.reqTimeout + 5*time.Second,
		IdleTimeout:       cfg.idleTimeout,
	}
}

// ensureKeys refuses to run without both API keys, except in --dev mode,
// which generates the missing ones and prints them once.
func ensureKeys(cfg *serveConfig) error {
	for _, k := range []struct {
		name string
		val  *string
	}{{"internal", &cfg.internalKey}, {"admin", &cfg.adminKey}} {
		if *k.val != "" {
			if len(*k.val) < handlers.MinKeyLen {
				return fmt.Errorf("the %s key is shorter than %d characters: use a long random one (e.g. openssl rand -hex 24)", k.name, handlers.MinKeyLen)
			}
			continue
		}
		if !cfg.dev {
			return fmt.Errorf("no %s key: set --%s-key or CREDPOOL_%s_KEY (or use --dev to generate one)", k.name, k.name, strings.ToUpper(k.name))
		}
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		*k.val = hex.EncodeToString(b)
		fmt.Fprintf(os.Stderr, "dev mode: generated %s key: %s\n", k.name, *k.val)
	}
	if cfg.internalKey == cfg.adminKey {
		return errors.New("the internal and admin keys must differ")
	}
	return nil
}

// redisLog passes go-redis's own log lines to the service's log, at debug
// level.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "redis client", "msg", fmt.Sprintf(format, v...))
}

// openCatalogDB opens the catalog's database named by --db: PostgreSQL
// for a postgres:// URL, else the SQLite file.
func openCatalogDB(ctx context.Context, db string) (*sqlitex.DB, *postgres.DB, error) {
	if postgres.IsURL(db) {
		pg, err := postgres.Open(ctx, db)
		return nil, pg, err
	}
	lite, err := sqlitex.Open(db)
	return lite, nil, err
}

// secretSealer reads the keys that seal secrets at rest from the
// environment: CREDPOOL_SECRET_KEY seals, CREDPOOL_SECRET_KEYS_OLD (comma
// separated) only opens, while a rotation is under way. In --dev mode a
// missing key is generated once and kept beside the catalog file, so the
// demo's secrets still open after a restart.
func secretSealer(cfg serveConfig) (*catalog.Sealer, error) {
	current, old := os.Getenv("CREDPOOL_SECRET_KEY"), os.Getenv("CREDPOOL_SECRET_KEYS_OLD")
	if current == "" && cfg.dev && postgres.IsURL(cfg.db) {
		return nil, errors.New("no secret key: with a PostgreSQL catalog set CREDPOOL_SECRET_KEY, the same on every instance (--dev generates one only beside a SQLite file)")
	}
	if current == "" && cfg.dev {
		var err error
		if current, err = devSecretKey(cfg.db + ".key"); err != nil {
			return nil, err
		}
	}
	if current == "" {
		return nil, errors.New("no secret key: set CREDPOOL_SECRET_KEY to 32 random bytes in base64 (openssl rand -base64 32); it seals the credentials in the catalog (or use --dev)")
	}
	s, err := catalog.ParseSealer(current, old)
	if err != nil {
		return nil, fmt.Errorf("CREDPOOL_SECRET_KEY or CREDPOOL_SECRET_KEYS_OLD: %w", err)
	}
	return s, nil
}

// devSecretKey reads the key in path, or writes a new one there (0600).
func devSecretKey(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("dev secret key: %w", err)
	}
	key, err := catalog.NewSealerKey()
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("dev secret key: %w", err)
	}
	fmt.Fprintf(os.Stderr, "dev mode: generated the secret key sealing the catalog's credentials in %s\n", path)
	return key, nil
}

// parseWeights overrides broker.DefaultWeights with name=value pairs.
func parseWeights(s string) (broker.Weights, error) {
	w := broker.DefaultWeights()
	fields := map[string]*float64{
		"capacity": &w.Capacity, "idle": &w.Idle, "success": &w.Success, "error": &w.Error,
		"rate_limit": &w.RateLimit, "cooldown": &w.Cooldown, "freshness": &w.Freshness, "jitter": &w.Jitter,
	}
	for _, pair := range strings.Split(s, ",") {
		if pair = strings.TrimSpace(pair); pair == "" {
			continue
		}
		name, val, ok := strings.Cut(pair, "=")
		f, known := fields[strings.TrimSpace(name)]
		if !ok || !known {
			return w, fmt.Errorf("%q: want name=value with name one of capacity, idle, success, error, rate_limit, cooldown, freshness, jitter", pair)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil || !(v >= 0) || math.IsInf(v, 1) {
			return w, fmt.Errorf("%q: want a finite number >= 0", pair)
		}
		*f = v
	}
	return w, nil
}

// parsePoolOrder reads "vip=default;gold=silver+default".
func parsePoolOrder(s string) (broker.PoolOrder, error) {
	o := broker.PoolOrder{}
	for _, rule := range strings.Split(s, ";") {
		if rule = strings.TrimSpace(rule); rule == "" {
			continue
		}
		pool, fallbacks, ok := strings.Cut(rule, "=")
		if !ok || !optimistic.ValidID(pool) {
			return nil, fmt.Errorf("%q: want pool=fallback[+fallback...]", rule)
		}
		for _, f := range strings.Split(fallbacks, "+") {
			if !optimistic.ValidID(f) {
				return nil, fmt.Errorf("%q: bad pool %q", rule, f)
			}
			o[pool] = append(o[pool], f)
		}
	}
	if err := o.Check(); err != nil {
		return nil, err
	}
	return o, nil
}

// seedDemo fills an empty catalog with a few fake keys so the API can be
// tried at once, and returns how many it put (none into a catalog that
// has keys).
func seedDemo(ctx context.Context, cat *catalog.SQL, admin *broker.Admin) (int, error) {
	existing, err := cat.List(ctx, "", "")
	if err != nil || len(existing) > 0 {
		return 0, err
	}
	if err := cat.SetAlias(ctx, "openai", "gpt-4o", "gpt-4o-2024-08-06"); err != nil {
		return 0, err
	}
	keys := []catalog.Key{
		{ID: "demo-default-1", Pool: "default", MaxConcurrentUses: 2},
		{ID: "demo-default-2", Pool: "default", MaxConcurrentUses: 1},
		{ID: "demo-vip-1", Pool: "vip", MaxConcurrentUses: 1},
	}
	for _, k := range keys {
		k.Provider, k.Status = "openai", optimistic.StatusAvailable
		k.Models = []string{"gpt-4o-2024-08-06", "gpt-4o-mini"}
		k.Secret = catalog.Secret("sk-demo-" + k.ID)
		if _, err := admin.Put(ctx, k); err != nil {
			return 0, err
		}
	}
	return len(keys), nil
}

// liveMaxAge is --live-max-age as broker.Options.LiveMaxAge takes it: 0
// is never kept.
func liveMaxAge(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// inspect is --inspect as broker.Options.Inspect takes it: 0 is all.
func inspect(n int) int {
	if n == 0 {
		return -1
	}
	return n
}
