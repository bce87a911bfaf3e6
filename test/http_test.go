package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/postgres"
	"github.com/credpool/credpool/internal/server"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/test/openapitest"
	"github.com/credpool/credpool/test/redistest"
)

const (
	internalKey = "internal-test-key"
	adminKey    = "admin-test-key-0123"
)

// service is credpool over real HTTP on loopback, a real catalog file and
// a real lease store.
type service struct {
	url   string
	dir   string            // holds the catalog's file
	db    *sqlitex.DB       // the catalog's file (and the SQLite store's); nil with pg
	pg    string            // the PostgreSQL catalog's URL, if it is there
	redis *redistest.Server // nil for the SQLite store
	proxy *redistest.Proxy  // between the service and Redis, if proxied
	cat   *catalog.SQL
	adm   *broker.Admin
	app   *server.Server
	logs  *syncBuffer
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// catalogHook lets a test act between the store's grant and the broker's
// re-check of the catalog.
type catalogHook struct {
	broker.Catalog
	beforeGet func(id string)
}

func (c catalogHook) Get(ctx context.Context, id string) (catalog.Key, error) {
	c.beforeGet(id)
	return c.Catalog.Get(ctx, id)
}

type serviceOptions struct {
	sqlite bool
	// postgres, if set, is the URL of the PostgreSQL database that holds
	// the catalog (pgtest.URL), instead of a SQLite file.
	postgres string
	// dir holds the catalog's file (and the SQLite store's); default: a
	// fresh temp dir.
	dir string
	// proxied puts the fault proxy between the service and Redis.
	proxied bool
	// maxLease is the longest lease (default: the broker's).
	maxLease time.Duration
	// redis, if set, is the server to use instead of a fresh one.
	redis *redistest.Server
	// redisURL, if set, is the store's URL instead of a fresh server's;
	// redisCluster reads it as a cluster URL.
	redisURL     string
	redisCluster bool
	// minReplicas is the store's Options.MinReplicas.
	minReplicas int
	beforeGet   func(id string)
	// wrap, if set, wraps the lease store the broker uses, to inject faults.
	wrap func(optimistic.LeaseStore) optimistic.LeaseStore
	// requestTimeout bounds each request (default: the handlers').
	requestTimeout time.Duration
	// liveMaxAge is the broker's Options.LiveMaxAge (default: the
	// broker's).
	liveMaxAge time.Duration
}

// contendedStore is a fault: every Allocate comes back as if the store's
// conflict retries had run out.
type contendedStore struct{ optimistic.LeaseStore }

func (contendedStore) Allocate(context.Context, optimistic.AllocateRequest) (optimistic.Lease, optimistic.Stats, error) {
	return optimistic.Lease{}, optimistic.Stats{Attempts: 11, Conflicts: 11}, fmt.Errorf("%w: allocate", optimistic.ErrContended)
}

// startService runs the service as serve assembles it (server.New), with
// the test's hooks.
func startService(t *testing.T, o serviceOptions) *service {
	t.Helper()
	if o.dir == "" {
		o.dir = t.TempDir()
	}
	sealer, err := catalog.NewSealer(bytes.Repeat([]byte{7}, 32))
	require.NoError(t, err)
	s := &service{dir: o.dir, pg: o.postgres, logs: &syncBuffer{}}
	cfg := server.Config{
		Sealer: sealer, MinReplicas: o.minReplicas, MaxLease: o.maxLease,
		InternalKey: internalKey, AdminKey: adminKey, WrapLeases: o.wrap, RequestTimeout: o.requestTimeout,
		LiveMaxAge: o.liveMaxAge,
		Logger:     slog.New(slog.NewJSONHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if o.postgres != "" {
		pg, err := postgres.Open(t.Context(), o.postgres)
		require.NoError(t, err)
		t.Cleanup(func() { _ = pg.Close() })
		cfg.Postgres = pg
	} else {
		s.db, err = sqlitex.Open(filepath.Join(o.dir, "credpool.db"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.db.Close() })
		cfg.DB = s.db
	}
	if o.beforeGet != nil {
		cfg.WrapCatalog = func(c broker.Catalog) broker.Catalog { return catalogHook{Catalog: c, beforeGet: o.beforeGet} }
	}
	if o.redisURL != "" {
		cfg.RedisURL, cfg.RedisCluster = o.redisURL, o.redisCluster
	} else if !o.sqlite {
		s.redis = o.redis
		if s.redis == nil {
			s.redis = redistest.Start(t)
		}
		addr := s.redis.Addr
		if o.proxied {
			s.proxy = redistest.NewProxy(t, s.redis.Addr)
			addr = s.proxy.Addr
		}
		cfg.RedisURL = "redis://" + addr
	}
	app, err := server.New(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { app.Close(context.Background()) })
	s.cat, s.adm, s.app = app.Catalog, app.Admin, app
	srv := httptest.NewServer(app.Handler)
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// call sends a JSON body (a string is sent as is) with the given header key
// and decodes the JSON answer; the exchange must match the OpenAPI
// document (openapitest).
func (s *service) call(t *testing.T, method, path, header, key string, body any) (int, http.Header, map[string]any) {
	t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		require.NoError(t, err)
		r = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, s.url+path, r)
	require.NoError(t, err)
	if header != "" {
		req.Header.Set(header, key)
	}
	resp, err := openapitest.Client(nil).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	if len(raw) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		require.NoError(t, json.Unmarshal(raw, &out), "body %s", raw)
	}
	return resp.StatusCode, resp.Header, out
}

// metric reads one unlabelled metric from /metrics; false if absent.
func (s *service) metric(t *testing.T, name string) (float64, bool) {
	t.Helper()
	resp, err := http.Get(s.url + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err, line)
			return f, true
		}
	}
	return 0, false
}

// answer is one HTTP reply, or the error that prevented it.
type answer struct {
	code int
	body map[string]any
	err  error
}

// allocateAll sends n allocate requests with body at once. The goroutines
// only report: the test checks the answers.
func (s *service) allocateAll(n int, body any) []answer {
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			a := &answers[i]
			a.code, a.body, a.err = s.post("/api/internal/allocate-key", internalKey, body)
		})
	}
	wg.Wait()
	return answers
}

func (s *service) internal(t *testing.T, path string, body any) (int, http.Header, map[string]any) {
	t.Helper()
	return s.call(t, http.MethodPost, "/api/internal/"+path, "X-Internal-Key", internalKey, body)
}

func (s *service) admin(t *testing.T, method, path string, body any) (int, map[string]any) {
	t.Helper()
	code, _, out := s.call(t, method, "/api/admin/"+path, "X-Admin-Key", adminKey, body)
	return code, out
}

func (s *service) putKey(t *testing.T, id, pool string, limit int, extra map[string]any) {
	t.Helper()
	body := map[string]any{
		"provider": "openai", "pool": pool, "models": []string{"gpt-4o-2024-08-06"},
		"secret": "sk-secret-" + id, "max_concurrent_uses": limit,
	}
	for k, v := range extra {
		body[k] = v
	}
	code, out := s.admin(t, http.MethodPut, "keys/"+id, body)
	require.Equal(t, http.StatusOK, code, "put %s: %v", id, out)
}

// disable disables key id in the catalog only, as an admin whose change
// the store has not seen yet.
func (s *service) disable(id string) error {
	k, err := s.cat.Get(context.Background(), id)
	if err != nil {
		return err
	}
	k.Status = optimistic.StatusDisabled
	_, err = s.cat.Put(context.Background(), k)
	return err
}

func allocBody(pool string) map[string]any {
	return map[string]any{"provider": "openai", "model": "gpt-4o-2024-08-06", "pool": pool, "lease_seconds": 30}
}

func errCode(out map[string]any) string {
	e, _ := out["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

func errField(out map[string]any) string {
	e, _ := out["error"].(map[string]any)
	field, _ := e["field"].(string)
	return field
}

func leaseBody(grant map[string]any) map[string]any {
	return map[string]any{"provider": "openai", "pool": grant["pool"], "key_id": grant["key_id"], "lease_id": grant["lease_id"]}
}

func withField(m map[string]any, k string, v any) map[string]any {
	out := map[string]any{}
	for kk, vv := range m {
		out[kk] = vv
	}
	out[k] = v
	return out
}

// forEachStore runs fn against the service on Redis and on SQLite.
func forEachStore(t *testing.T, fn func(t *testing.T, sqlite bool)) {
	for _, sqlite := range []bool{false, true} {
		name := "redis"
		if sqlite {
			name = "sqlite"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, sqlite)
		})
	}
}

func TestHTTPLeaseLifecycle(t *testing.T) {
	forEachStore(t, func(t *testing.T, sqlite bool) {
		s := startService(t, serviceOptions{sqlite: sqlite})
		s.putKey(t, "k1", "default", 1, nil)
		code, out := s.admin(t, http.MethodPut, "aliases/openai/gpt-4o", map[string]any{"model": "gpt-4o-2024-08-06"})
		require.Equal(t, http.StatusOK, code, "%v", out)
		code, out = s.admin(t, http.MethodPut, "aliases/openai/gpt-4o", map[string]any{"model": ""})
		require.Equal(t, http.StatusBadRequest, code, "%v", out)

		code, _, g := s.internal(t, "allocate-key", map[string]any{"provider": "openai", "model": "gpt-4o"})
		require.Equal(t, http.StatusOK, code, "%v", g)
		require.Equal(t, "k1", g["key_id"])
		require.Equal(t, "default", g["pool"], "pool defaults to default")
		require.Equal(t, "gpt-4o-2024-08-06", g["provider_model"], "the alias is resolved")
		require.Equal(t, map[string]any{"api_key": "sk-secret-k1"}, g["credential"])
		require.Greater(t, g["fencing_token"], float64(time.Now().Add(-time.Minute).UnixMicro()), "a fencing token carries the store's clock")
		until, err := time.Parse(time.RFC3339Nano, g["lease_until"].(string))
		require.NoError(t, err)
		require.WithinDuration(t, time.Now().Add(35*time.Second), until, 5*time.Second, "lease_seconds defaults to 35")

		code, _, r := s.internal(t, "renew", withField(leaseBody(g), "lease_seconds", 600))
		require.Equal(t, http.StatusOK, code, "%v", r)
		renewed, err := time.Parse(time.RFC3339Nano, r["lease_until"].(string))
		require.NoError(t, err)
		require.True(t, renewed.After(until))

		code, _, r = s.internal(t, "report", withField(leaseBody(g), "outcome", "success"))
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, map[string]any{"released": true}, r)
		// Counters and last use are written behind, within a second.
		deadline := time.Now().Add(10 * time.Second)
		for {
			code, out = s.admin(t, http.MethodGet, "keys/k1", nil)
			require.Equal(t, http.StatusOK, code)
			if out["successes"] == float64(1) || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		require.EqualValues(t, 1, out["successes"])
		require.EqualValues(t, 0, out["live_leases"])
		require.NotEmpty(t, out["last_used_at"])

		code, _, r = s.internal(t, "release", leaseBody(g))
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, map[string]any{"released": false, "reason": "not_found_or_expired"}, r, "release is idempotent")
		code, _, r = s.internal(t, "renew", leaseBody(g))
		require.Equal(t, http.StatusGone, code)
		require.Equal(t, "lease_lost", errCode(r))
	})
}

func TestHTTPStatusCodes(t *testing.T) {
	forEachStore(t, func(t *testing.T, sqlite bool) {
		s := startService(t, serviceOptions{sqlite: sqlite})
		s.putKey(t, "only", "default", 1, nil)

		code, _, out := s.internal(t, "allocate-key", map[string]any{"provider": "nobody", "model": "m"})
		require.Equal(t, http.StatusNotFound, code)
		require.Equal(t, "no_candidates", errCode(out))

		code, _, out = s.internal(t, "allocate-key", map[string]any{"provider": "openai", "model": "claude-3"})
		require.Equal(t, http.StatusConflict, code)
		require.Equal(t, "policy_conflict", errCode(out))

		code, _, g := s.internal(t, "allocate-key", allocBody("default"))
		require.Equal(t, http.StatusOK, code)
		code, h, out := s.internal(t, "allocate-key", allocBody("default"))
		require.Equal(t, http.StatusTooManyRequests, code)
		require.Equal(t, "pool_exhausted", errCode(out))
		require.Equal(t, "1", h.Get("Retry-After"), "a held lease may be released any moment, not only at its expiry")

		code, _, out = s.internal(t, "release", withField(leaseBody(g), "pool", "vip"))
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, map[string]any{"released": false, "reason": "owner_mismatch"}, out)

		for _, c := range []struct {
			body  any
			field string
		}{
			{`{"provider":"openai","model":"m","surprise":1}`, "surprise"},
			{map[string]any{"model": "m"}, "provider"},
			{map[string]any{"provider": "openai"}, "model"},
			{map[string]any{"provider": "openai", "model": "m", "lease_seconds": 0}, "lease_seconds"},
			{map[string]any{"provider": "openai", "model": "m", "lease_seconds": 3601}, "lease_seconds"},
			{map[string]any{"provider": "openai", "model": "m", "pool": "a/b"}, "pool"},
			{map[string]any{"provider": "openai", "model": "m", "lease_seconds": "35"}, "lease_seconds"},
		} {
			code, _, out := s.internal(t, "allocate-key", c.body)
			require.Equal(t, http.StatusBadRequest, code, "%v", c.body)
			require.Equal(t, c.field, out["error"].(map[string]any)["field"], "%v", c.body)
		}
		code, _, _ = s.internal(t, "allocate-key", `{"provider":`)
		require.Equal(t, http.StatusBadRequest, code)
		code, _, _ = s.internal(t, "allocate-key", `{"provider":"openai","model":"`+strings.Repeat("x", 70<<10)+`"}`)
		require.Equal(t, http.StatusRequestEntityTooLarge, code)
		code, _, out = s.internal(t, "report", withField(leaseBody(g), "outcome", "meh"))
		require.Equal(t, http.StatusBadRequest, code)
		require.Equal(t, "outcome", out["error"].(map[string]any)["field"])
	})
}

func TestHTTPAuth(t *testing.T) {
	s := startService(t, serviceOptions{sqlite: true})
	for _, c := range []struct{ method, path, header, key string }{
		{http.MethodPost, "/api/internal/allocate-key", "", ""},
		{http.MethodPost, "/api/internal/allocate-key", "X-Internal-Key", "wrong"},
		{http.MethodPost, "/api/internal/allocate-key", "X-Admin-Key", adminKey},
		{http.MethodPost, "/api/internal/release", "X-Internal-Key", internalKey + "x"},
		{http.MethodGet, "/api/admin/keys", "", ""},
		{http.MethodGet, "/api/admin/keys", "X-Admin-Key", "wrong"},
		{http.MethodGet, "/api/admin/keys", "X-Internal-Key", internalKey},
		{http.MethodDelete, "/api/admin/keys/k", "X-Admin-Key", ""},
	} {
		code, _, out := s.call(t, c.method, c.path, c.header, c.key, map[string]any{})
		require.Equal(t, http.StatusUnauthorized, code, "%+v", c)
		require.Equal(t, "unauthorized", errCode(out))
	}
}

func TestHTTPStoreDownIs503(t *testing.T) {
	s := startService(t, serviceOptions{})
	s.putKey(t, "k", "default", 1, nil)
	s.redis.Stop()
	code, _, out := s.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "store_unavailable", errCode(out))
	_, port, _ := strings.Cut(s.redis.Addr, ":")
	require.NotContains(t, fmt.Sprint(out), port, "a 503 body names no address")
	require.Contains(t, s.logs.String(), "store_unavailable", "the log keeps the cause")
	code, _, out = s.call(t, http.MethodGet, "/readyz", "", "", nil)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "redis", out["store"])
	require.Equal(t, "store_unavailable", out["error"], "readyz names the failing part, not its address")
}

// An error answer names the field at fault, never the value sent: a secret
// pasted into the wrong field must not come back.
func TestHTTPErrorsEchoNoValues(t *testing.T) {
	s := startService(t, serviceOptions{sqlite: true})
	const pasted = "sk-live-pasted-into-the-wrong-field"
	for _, body := range []map[string]any{
		{"provider": "openai", "pool": "default", "models": []string{"m"}, "secret": "s", "cooldown_until": pasted},
		{"provider": "openai", "pool": "default", "models": []string{"m"}, "secret": "s", "max_concurrent_uses": pasted},
		{"provider": "openai", "pool": "default", "models": []string{"m"}, "secret": "s", "status": pasted},
	} {
		code, out := s.admin(t, http.MethodPut, "keys/k", body)
		require.Equal(t, http.StatusBadRequest, code, "%v", out)
		require.NotContains(t, fmt.Sprint(out), pasted)
	}
	// Values that fail validation deeper down, in the catalog.
	const invalid = "sk live/pasted+secret"
	for _, body := range []map[string]any{
		{"provider": invalid, "pool": "default", "models": []string{"m"}, "secret": "s"},
		{"provider": "openai", "pool": invalid, "models": []string{"m"}, "secret": "s"},
		{"provider": "openai", "pool": "default", "models": []string{invalid}, "secret": "s"},
	} {
		code, out := s.admin(t, http.MethodPut, "keys/k", body)
		require.Equal(t, http.StatusBadRequest, code, "%v", out)
		require.NotContains(t, fmt.Sprint(out), invalid)
	}
	code, out := s.admin(t, http.MethodPut, "aliases/openai/gpt-4o", map[string]any{"model": invalid})
	require.Equal(t, http.StatusBadRequest, code, "%v", out)
	require.NotContains(t, fmt.Sprint(out), invalid)
	require.Equal(t, "model", errField(out))
	require.NotContains(t, fmt.Sprint(out), "optimistic:", "in the API's words")
	code, out = s.admin(t, http.MethodPut, "aliases/openai/a%20b", map[string]any{"model": "m"})
	require.Equal(t, http.StatusBadRequest, code, "%v", out)
	require.Equal(t, "alias", errField(out))
	code, out = s.admin(t, http.MethodPut, "keys/k", map[string]any{"provider": "openai", "pool": "default", "models": []string{"m"}, "secret": " \t "})
	require.Equal(t, http.StatusBadRequest, code, "a blank secret: %v", out)
	require.Equal(t, "secret", errField(out))
	code, _, out = s.internal(t, "allocate-key", map[string]any{"provider": "openai", "model": "m", "lease_seconds": pasted})
	require.Equal(t, http.StatusBadRequest, code)
	require.NotContains(t, fmt.Sprint(out), pasted)
	require.NotContains(t, s.logs.String(), pasted)
}

func TestHTTPContendedIs429(t *testing.T) {
	s := startService(t, serviceOptions{wrap: func(l optimistic.LeaseStore) optimistic.LeaseStore { return contendedStore{l} }})
	s.putKey(t, "k", "default", 1, nil)
	code, h, out := s.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusTooManyRequests, code)
	require.Equal(t, "contended", errCode(out))
	require.Equal(t, "1", h.Get("Retry-After"))
}

func TestHTTPCatalogDownIs503(t *testing.T) {
	s := startService(t, serviceOptions{})
	s.putKey(t, "k", "default", 1, nil)
	require.NoError(t, s.db.Close())
	code, _, out := s.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "catalog_unavailable", errCode(out))
	logged := s.logs.String()
	require.Contains(t, logged, "catalog: read generation: sql: database is closed", "the log keeps the cause")
	require.NotContains(t, logged, optimistic.ErrStore.Error(), "the log names the catalog, not the lease store")
	code, _, out = s.call(t, http.MethodGet, "/readyz", "", "", nil)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "catalog_unavailable", out["error"])
}

// While the catalog is down nobody knows which keys are held back: the
// metrics leave that out rather than say 0, and the count of keys found
// lost stays where it was (a counter never goes back).
func TestHTTPCatalogDownKeepsLossMetrics(t *testing.T) {
	s := startService(t, serviceOptions{})
	s.putKey(t, "k", "default", 1, nil)
	require.NoError(t, s.redis.Client(t).FlushAll(t.Context()).Err())
	code, _, out := s.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusTooManyRequests, code, "the lost key is held back: %v", out)
	held, ok := s.metric(t, "credpool_store_lost_keys_held")
	require.True(t, ok)
	require.EqualValues(t, 1, held)
	total, _ := s.metric(t, "credpool_store_lost_keys_total")
	require.EqualValues(t, 1, total)

	require.NoError(t, s.db.Close())
	_, ok = s.metric(t, "credpool_store_lost_keys_held")
	require.False(t, ok, "held back keys unknown, not 0")
	total, _ = s.metric(t, "credpool_store_lost_keys_total")
	require.EqualValues(t, 1, total, "the counter kept its value")
}

func TestHTTPPoolFallbackIsOneWay(t *testing.T) {
	forEachStore(t, func(t *testing.T, sqlite bool) {
		s := startService(t, serviceOptions{sqlite: sqlite})
		s.putKey(t, "vip-1", "vip", 1, nil)
		s.putKey(t, "default-1", "default", 1, nil)

		code, _, vip := s.internal(t, "allocate-key", allocBody("vip"))
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "vip-1", vip["key_id"], "vip uses its own pool first")
		code, _, g := s.internal(t, "allocate-key", allocBody("vip"))
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "default-1", g["key_id"], "a full vip pool borrows default")
		require.Equal(t, "default", g["pool"], "the response names the pool that granted")

		// default full, vip free: default must not borrow vip.
		code, _, _ = s.internal(t, "release", leaseBody(vip))
		require.Equal(t, http.StatusOK, code)
		code, h, out := s.internal(t, "allocate-key", allocBody("default"))
		require.Equal(t, http.StatusTooManyRequests, code, "default never borrows vip: %v", out)
		require.NotEmpty(t, h.Get("Retry-After"))
		_, key := s.admin(t, http.MethodGet, "keys/vip-1", nil)
		require.EqualValues(t, 0, key["live_leases"])

		// Every default key disabled: nothing frees up by itself, so not 429.
		s.putKey(t, "default-1", "default", 1, map[string]any{"status": "disabled"})
		code, _, out = s.internal(t, "allocate-key", allocBody("default"))
		require.Equal(t, http.StatusConflict, code, "%v", out)
		require.Equal(t, "policy_conflict", errCode(out))
	})
}

func TestHTTPDisabledAfterGrantIsGivenBack(t *testing.T) {
	forEachStore(t, func(t *testing.T, sqlite bool) {
		var (
			s        *service
			disabled atomic.Bool
			hookErr  = make(chan error, 1)
		)
		s = startService(t, serviceOptions{sqlite: sqlite, beforeGet: func(id string) {
			// The admin disables the first key the store grants, between
			// the grant and the broker's re-check. This runs on the
			// server's goroutine, so it reports instead of failing.
			if !disabled.CompareAndSwap(false, true) {
				return
			}
			hookErr <- s.disable(id)
		}})
		s.putKey(t, "a", "default", 1, nil)
		s.putKey(t, "b", "default", 1, nil)

		code, _, g := s.internal(t, "allocate-key", allocBody("default"))
		require.Equal(t, http.StatusOK, code, "%v", g)
		require.NoError(t, <-hookErr)
		got := g["key_id"].(string)
		other := map[string]string{"a": "b", "b": "a"}[got]
		_, out := s.admin(t, http.MethodGet, "keys/"+other, nil)
		require.Equal(t, "disabled", out["status"], "the disabled key is not the one returned")
		require.EqualValues(t, 0, out["live_leases"], "its slot was given back")
		require.Contains(t, s.logs.String(), `"reason":"status disabled"`)
	})
}

func TestHTTPConcurrentAllocatesOnLimitOne(t *testing.T) {
	forEachStore(t, func(t *testing.T, sqlite bool) {
		s := startService(t, serviceOptions{sqlite: sqlite})
		s.putKey(t, "solo", "default", 1, nil)
		count := map[int]int{}
		for _, a := range s.allocateAll(64, allocBody("default")) {
			require.NoError(t, a.err)
			count[a.code]++
		}
		require.Equal(t, 1, count[http.StatusOK], "codes: %v", count)
		require.Equal(t, 63, count[http.StatusTooManyRequests], "codes: %v", count)
	})
}

func TestHTTPReportsChangeKeyHealth(t *testing.T) {
	forEachStore(t, func(t *testing.T, sqlite bool) {
		s := startService(t, serviceOptions{sqlite: sqlite})
		s.putKey(t, "k", "default", 2, nil)

		_, _, g := s.internal(t, "allocate-key", allocBody("default"))
		_, _, held := s.internal(t, "allocate-key", allocBody("default"))
		code, _, out := s.internal(t, "report", withField(withField(leaseBody(g), "outcome", "rate_limited"), "retry_after_seconds", 120))
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, true, out["released"])
		code, h, out := s.internal(t, "allocate-key", allocBody("default"))
		require.Equal(t, http.StatusTooManyRequests, code)
		require.Equal(t, "pool_exhausted", errCode(out))
		wait, _ := strconv.Atoi(h.Get("Retry-After"))
		require.InDelta(t, 120, wait, 2, "Retry-After is the cooldown's end")

		// Reports for a lease the caller does not hold change nothing.
		code, _, out = s.internal(t, "report", withField(withField(leaseBody(held), "pool", "vip"), "outcome", "auth_error"))
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, map[string]any{"released": false, "reason": "owner_mismatch"}, out)
		code, _, out = s.internal(t, "report", withField(leaseBody(g), "outcome", "rate_limited"))
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, map[string]any{"released": false, "reason": "not_found_or_expired"}, out, "a repeated report")
		_, key := s.admin(t, http.MethodGet, "keys/k", nil)
		require.Equal(t, "rate_limited", key["status"])
		require.EqualValues(t, 1, key["rate_limit_hits"], "the repeated report did not count")

		code, _, _ = s.internal(t, "report", withField(leaseBody(held), "outcome", "auth_error"))
		require.Equal(t, http.StatusOK, code)
		_, key = s.admin(t, http.MethodGet, "keys/k", nil)
		require.Equal(t, "disabled", key["status"])
		require.EqualValues(t, 1, key["errors"])
		require.EqualValues(t, 1, key["rate_limit_hits"])
	})
}

// A vip request served by default, renewed as vip: 409 owner_mismatch, and
// the lease stays held (a 410 would tell the caller to stop using a
// credential it still holds, and leave the slot taken until expiry).
func TestHTTPRenewUnderAnotherPoolIsAMismatch(t *testing.T) {
	forEachStore(t, func(t *testing.T, sqlite bool) {
		s := startService(t, serviceOptions{sqlite: sqlite})
		s.putKey(t, "k", "default", 1, nil)
		code, _, g := s.internal(t, "allocate-key", allocBody("vip"))
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "default", g["pool"])
		code, _, out := s.internal(t, "renew", withField(leaseBody(g), "pool", "vip"))
		require.Equal(t, http.StatusConflict, code)
		require.Equal(t, "owner_mismatch", errCode(out))
		_, key := s.admin(t, http.MethodGet, "keys/k", nil)
		require.EqualValues(t, 1, key["live_leases"], "left alone")
		code, _, _ = s.internal(t, "renew", leaseBody(g))
		require.Equal(t, http.StatusOK, code, "renewed under the pool it was granted from")
	})
}

func TestHTTPRenewOfDisabledKeyIsLost(t *testing.T) {
	forEachStore(t, func(t *testing.T, sqlite bool) {
		s := startService(t, serviceOptions{sqlite: sqlite})
		s.putKey(t, "k", "default", 1, nil)
		_, _, g := s.internal(t, "allocate-key", allocBody("default"))
		s.putKey(t, "k", "default", 1, map[string]any{"status": "disabled"})
		code, _, out := s.internal(t, "renew", leaseBody(g))
		require.Equal(t, http.StatusGone, code)
		require.Equal(t, "lease_lost", errCode(out))
		_, key := s.admin(t, http.MethodGet, "keys/k", nil)
		require.EqualValues(t, 0, key["live_leases"], "the holder's slot is released")
	})
}

func TestHTTPAdmin(t *testing.T) {
	forEachStore(t, func(t *testing.T, sqlite bool) {
		s := startService(t, serviceOptions{sqlite: sqlite})
		s.putKey(t, "admin-key-1", "default", 3, nil)
		code, out := s.admin(t, http.MethodPut, "keys/bad", map[string]any{"provider": "openai", "pool": "default", "models": []string{"m"}})
		require.Equal(t, http.StatusBadRequest, code)
		require.Equal(t, "secret", out["error"].(map[string]any)["field"])
		code, out = s.admin(t, http.MethodPut, "keys/bad", map[string]any{"provider": "openai", "models": []string{"m"}, "secret": "sk-x"})
		require.Equal(t, http.StatusBadRequest, code)
		require.Equal(t, "pool", out["error"].(map[string]any)["field"], "%v", out)
		code, _ = s.admin(t, http.MethodGet, "keys/missing", nil)
		require.Equal(t, http.StatusNotFound, code)

		for range 2 {
			code, _, _ := s.internal(t, "allocate-key", allocBody("default"))
			require.Equal(t, http.StatusOK, code)
		}
		code, out = s.admin(t, http.MethodGet, "keys", nil)
		require.Equal(t, http.StatusOK, code)
		keys := out["keys"].([]any)
		require.Len(t, keys, 1)
		k := keys[0].(map[string]any)
		require.EqualValues(t, 2, k["live_leases"])
		require.EqualValues(t, 3, k["max_concurrent_uses"])
		require.Equal(t, true, k["in_store"])

		code, out = s.admin(t, http.MethodPost, "keys/admin-key-1/clear-leases", nil)
		require.Equal(t, http.StatusOK, code)
		require.EqualValues(t, 2, out["cleared"])
		code, out = s.admin(t, http.MethodPost, "keys/admin-key-typo/clear-leases", nil)
		require.Equal(t, http.StatusNotFound, code)
		require.Equal(t, "key_not_found", errCode(out))
		code, out = s.admin(t, http.MethodPost, "sync", nil)
		require.Equal(t, http.StatusOK, code)
		require.EqualValues(t, 1, out["synced"])
		code, _ = s.admin(t, http.MethodDelete, "keys/admin-key-1", nil)
		require.Equal(t, http.StatusOK, code)
		code, _ = s.admin(t, http.MethodDelete, "keys/admin-key-1", nil)
		require.Equal(t, http.StatusNotFound, code)
		if s.redis != nil {
			require.Empty(t, s.redis.Find(t, "admin-key-1"), "no Redis trace of a deleted key")
		}
		code, _, out = s.internal(t, "allocate-key", allocBody("default"))
		require.Equal(t, http.StatusNotFound, code)
		require.Equal(t, "no_candidates", errCode(out))
	})
}

// PUT /api/admin/keys writes every key of the body or none, and syncs
// them into the lease store; more than 1,000 keys are refused.
func TestHTTPAdminPutKeys(t *testing.T) {
	forEachStore(t, func(t *testing.T, sqlite bool) {
		// What is tested is that a body of 1,000 keys is taken, not how
		// fast: a minute's budget keeps a loaded machine (the race
		// detector, the other tests) from failing it.
		s := startService(t, serviceOptions{sqlite: sqlite, requestTimeout: time.Minute})
		key := func(id string, limit int) map[string]any {
			return map[string]any{
				"id": id, "provider": "openai", "pool": "default", "models": []string{"gpt-4o-2024-08-06"},
				"secret": "sk-secret-" + id, "max_concurrent_uses": limit,
			}
		}
		code, out := s.admin(t, http.MethodPut, "keys", []any{key("b1", 1), key("b2", 2), key("b3", 3)})
		require.Equal(t, http.StatusOK, code, "%v", out)
		require.EqualValues(t, 3, out["written"])
		code, out = s.admin(t, http.MethodGet, "keys/b2", nil)
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, true, out["in_store"], "synced into the lease store")
		require.EqualValues(t, 2, out["max_concurrent_uses"])
		code, _, _ = s.internal(t, "allocate-key", allocBody("default"))
		require.Equal(t, http.StatusOK, code)

		// A bad key anywhere, found by the handler or by the catalog: none
		// is written, not even the ones before it.
		badModel := key("b4", 1)
		badModel["models"] = []string{"gpt 4o"}
		noSecret := key("b4", 1)
		delete(noSecret, "secret")
		noPool := key("b4", 1)
		delete(noPool, "pool")
		noModels := key("b4", 1)
		noModels["models"] = []string{}
		for _, c := range []struct {
			keys  []any
			field string
		}{
			{[]any{key("new-1", 1), key("b1", 5), badModel}, "[2].models[0]"},
			{[]any{key("new-1", 1), key("b1", 5), noSecret}, "[2].secret"},
			{[]any{key("new-1", 1), noPool}, "[1].pool"},
			{[]any{key("new-1", 1), noModels}, "[1].models"},
			{[]any{key("new-1", 1), key("b1", 0)}, "[1].max_concurrent_uses"},
			{[]any{key("new-1", 1), key("new-1", 5)}, "[1].id"},
			{[]any{}, ""},
		} {
			code, out = s.admin(t, http.MethodPut, "keys", c.keys)
			require.Equal(t, http.StatusBadRequest, code, "%v", out)
			require.Equal(t, "invalid_request", errCode(out))
			field, _ := out["error"].(map[string]any)["field"].(string)
			require.Equal(t, c.field, field)
			code, _ = s.admin(t, http.MethodGet, "keys/new-1", nil)
			require.Equal(t, http.StatusNotFound, code, "nothing written")
			_, out = s.admin(t, http.MethodGet, "keys/b1", nil)
			require.EqualValues(t, 1, out["max_concurrent_uses"], "nothing written")
		}

		many := make([]any, 1001)
		for i := range many {
			many[i] = key(fmt.Sprintf("m%04d", i), 1)
		}
		code, out = s.admin(t, http.MethodPut, "keys", many)
		require.Equal(t, http.StatusBadRequest, code, "%v", out)
		code, out = s.admin(t, http.MethodPut, "keys", many[:1000])
		require.Equal(t, http.StatusOK, code, "1,000 keys, over the 64 KiB of other bodies: %v", out)
		require.EqualValues(t, 1000, out["written"])
	})
}

// The secret appears only in the allocate response: not in Redis, the logs,
// /metrics or the admin API.
func TestHTTPSecretStaysInCatalog(t *testing.T) {
	s := startService(t, serviceOptions{})
	s.putKey(t, "k", "default", 2, nil)
	const secret = "sk-secret-k"
	_, _, g := s.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, secret, g["credential"].(map[string]any)["api_key"])
	s.internal(t, "renew", leaseBody(g))
	s.internal(t, "report", withField(leaseBody(g), "outcome", "rate_limited"))
	s.internal(t, "allocate-key", allocBody("default"))

	require.Empty(t, s.redis.Find(t, secret), "secret in Redis")
	var stored string
	require.NoError(t, s.db.QueryRowContext(t.Context(), `SELECT secret FROM catalog_keys WHERE id = 'k'`).Scan(&stored))
	require.NotContains(t, stored, secret, "secret in the clear in the catalog")
	require.NotContains(t, s.logs.String(), secret, "secret in the logs")
	require.Contains(t, s.logs.String(), g["lease_id"], "the logs do carry lease ids")
	for _, path := range []string{"/metrics", "/api/admin/keys", "/api/admin/keys/k"} {
		req, _ := http.NewRequest(http.MethodGet, s.url+path, nil)
		req.Header.Set("X-Admin-Key", adminKey)
		resp, err := openapitest.Client(nil).Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		require.NotContains(t, string(body), secret, path)
		if path == "/metrics" {
			for _, line := range []string{
				`credpool_allocations_total{result="granted"} 1`,
				`credpool_allocations_total{result="pool_exhausted"} 1`,
				`credpool_renewals_total{result="renewed"} 1`,
				`credpool_reports_total{outcome="rate_limited"} 1`,
				// Uncontended: no conflict retried, and named for what it
				// counts on every store, not for WATCH.
				`credpool_allocate_conflicts_total 0`,
			} {
				require.True(t, strings.Contains(string(body), line+"\n"), "/metrics lacks %s", line)
			}
		}
	}
}

func TestHTTPHealth(t *testing.T) {
	s := startService(t, serviceOptions{sqlite: true})
	code, _, out := s.call(t, http.MethodGet, "/healthz", "", "", nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok", out["status"])
	code, _, out = s.call(t, http.MethodGet, "/readyz", "", "", nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "sqlite", out["store"])
	code, _, out = s.call(t, http.MethodGet, "/nowhere", "", "", nil)
	require.Equal(t, http.StatusNotFound, code)
	require.Equal(t, "not_found", errCode(out))
	// Near a route is no route: 404, not a redirect.
	code, _, out = s.call(t, http.MethodPost, "/api/internal/allocate-key/", "X-Internal-Key", internalKey, allocBody("default"))
	require.Equal(t, http.StatusNotFound, code)
	require.Equal(t, "not_found", errCode(out))
	code, out = s.admin(t, http.MethodGet, "keys/", nil)
	require.Equal(t, http.StatusNotFound, code)
	require.Equal(t, "not_found", errCode(out))
}

// An alias may hold a "/" (org/model), sent escaped in its path segment.
func TestHTTPAliasWithASlash(t *testing.T) {
	s := startService(t, serviceOptions{sqlite: true})
	s.putKey(t, "k", "default", 1, map[string]any{"models": []string{"meta/llama-3-70b"}})
	code, out := s.admin(t, http.MethodPut, "aliases/openai/meta%2Fllama", map[string]any{"model": "meta/llama-3-70b"})
	require.Equal(t, http.StatusOK, code, "%v", out)
	require.Equal(t, "meta/llama", out["alias"])
	code, _, g := s.internal(t, "allocate-key", map[string]any{"provider": "openai", "model": "meta/llama"})
	require.Equal(t, http.StatusOK, code, "%v", g)
	require.Equal(t, "meta/llama-3-70b", g["provider_model"])
	code, out = s.admin(t, http.MethodGet, "keys/k%2Fx", nil)
	require.Equal(t, http.StatusBadRequest, code, "an id holds no slash: %v", out)
	// A "+" is a "+" in a path, escapes or not (url.PathEscape keeps it).
	for path, alias := range map[string]string{"meta%2Fa+b": "meta/a+b", "a+b": "a+b", "a%3Bb+c": "a;b+c"} {
		code, out = s.admin(t, http.MethodPut, "aliases/openai/"+path, map[string]any{"model": "meta/llama-3-70b"})
		require.Equal(t, http.StatusOK, code, "%s: %v", path, out)
		require.Equal(t, alias, out["alias"])
	}
}

func TestHTTPRequestIDIsIdempotent(t *testing.T) {
	forEachStore(t, func(t *testing.T, sqlite bool) {
		s := startService(t, serviceOptions{sqlite: sqlite})
		s.putKey(t, "k", "default", 3, nil)
		body := withField(allocBody("default"), "request_id", "req-1")

		code, _, first := s.internal(t, "allocate-key", body)
		require.Equal(t, http.StatusOK, code, "%v", first)
		code, _, again := s.internal(t, "allocate-key", body)
		require.Equal(t, http.StatusOK, code, "%v", again)
		require.Equal(t, first["lease_id"], again["lease_id"], "same request id, same lease")
		require.Equal(t, first["credential"], again["credential"])
		_, key := s.admin(t, http.MethodGet, "keys/k", nil)
		require.EqualValues(t, 1, key["live_leases"], "no second slot")

		code, _, other := s.internal(t, "allocate-key", withField(body, "request_id", "req-2"))
		require.Equal(t, http.StatusOK, code)
		require.NotEqual(t, first["lease_id"], other["lease_id"])

		// Once the lease is released the id is free again: a fresh lease.
		code, _, _ = s.internal(t, "release", leaseBody(first))
		require.Equal(t, http.StatusOK, code)
		code, _, fresh := s.internal(t, "allocate-key", body)
		require.Equal(t, http.StatusOK, code, "%v", fresh)
		require.NotEqual(t, first["lease_id"], fresh["lease_id"])

		code, _, out := s.internal(t, "allocate-key", withField(body, "request_id", "no spaces"))
		require.Equal(t, http.StatusBadRequest, code)
		require.Equal(t, "request_id", out["error"].(map[string]any)["field"])
	})
}

func TestHTTPConcurrentSameRequestID(t *testing.T) {
	forEachStore(t, func(t *testing.T, sqlite bool) {
		s := startService(t, serviceOptions{sqlite: sqlite})
		s.putKey(t, "k", "default", 5, nil)
		seen := map[string]int{}
		for _, a := range s.allocateAll(16, withField(allocBody("default"), "request_id", "same")) {
			require.NoError(t, a.err)
			switch a.code {
			case http.StatusOK:
				seen[a.body["lease_id"].(string)]++
			case http.StatusConflict:
				require.Equal(t, "request_in_flight", errCode(a.body))
			default:
				t.Fatalf("unexpected answer %d %v", a.code, a.body)
			}
		}
		granted := len(seen)
		require.Equal(t, 1, granted, "one lease for one request id: %v", seen)
		_, key := s.admin(t, http.MethodGet, "keys/k", nil)
		require.EqualValues(t, 1, key["live_leases"], "one slot for one request id")
	})
}

// An error answer's message is for the client: it reads without the Go
// package prefixes ("optimistic: ", "broker: ") the logs' errors carry,
// whatever the answer; its code is the contract's.
func TestHTTPErrorMessagesReadCleanly(t *testing.T) {
	prefixed := regexp.MustCompile(`(^|: )(optimistic|broker|catalog|requestlog): `)
	check := func(t *testing.T, code, wantStatus int, out map[string]any, wantCode string) {
		t.Helper()
		require.Equal(t, wantStatus, code, "%v", out)
		require.Equal(t, wantCode, errCode(out))
		msg, _ := out["error"].(map[string]any)["message"].(string)
		require.NotEmpty(t, msg)
		require.NotRegexp(t, prefixed, msg, "%s in the client's words", wantCode)
	}
	s := startService(t, serviceOptions{})
	s.putKey(t, "k", "default", 1, nil)
	body := withField(allocBody("vip"), "request_id", "req-1")
	code, _, g := s.internal(t, "allocate-key", body)
	require.Equal(t, http.StatusOK, code, "%v", g)

	code, _, out := s.internal(t, "allocate-key", allocBody("default"))
	check(t, code, http.StatusTooManyRequests, out, "pool_exhausted")
	require.Contains(t, out["error"].(map[string]any)["message"], "no free slot", "the cause, unprefixed")
	code, _, out = s.internal(t, "allocate-key", map[string]any{"provider": "nobody", "model": "m"})
	check(t, code, http.StatusNotFound, out, "no_candidates")
	code, _, out = s.internal(t, "allocate-key", map[string]any{"provider": "openai", "model": "claude-3"})
	check(t, code, http.StatusConflict, out, "policy_conflict")
	code, _, out = s.internal(t, "allocate-key", withField(body, "model", "gpt-4o-mini"))
	check(t, code, http.StatusConflict, out, "request_id_reused")
	code, _, out = s.internal(t, "renew", withField(leaseBody(g), "pool", "vip"))
	check(t, code, http.StatusConflict, out, "owner_mismatch")
	code, _, out = s.internal(t, "renew", withField(leaseBody(g), "lease_id", "gone"))
	check(t, code, http.StatusGone, out, "lease_lost")
	code, out = s.admin(t, http.MethodGet, "keys/missing", nil)
	check(t, code, http.StatusNotFound, out, "key_not_found")
	code, out = s.admin(t, http.MethodDelete, "aliases/openai/missing", nil)
	check(t, code, http.StatusNotFound, out, "alias_not_found")

	hot := startService(t, serviceOptions{wrap: func(l optimistic.LeaseStore) optimistic.LeaseStore { return contendedStore{l} }})
	hot.putKey(t, "k", "default", 1, nil)
	code, _, out = hot.internal(t, "allocate-key", allocBody("default"))
	check(t, code, http.StatusTooManyRequests, out, "contended")
}
