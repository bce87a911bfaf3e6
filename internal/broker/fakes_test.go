package broker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/requestlog"
	"github.com/credpool/credpool/internal/sqlitestore"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/internal/sqlitex/sqlitextest"
	"github.com/credpool/credpool/optimistic"
)

// The wrappers satisfy what the broker asks of the real objects they wrap.
var (
	_ broker.Catalog        = (*flakyCatalog)(nil)
	_ broker.AdminCatalog   = (*flakyCatalog)(nil)
	_ broker.Catalog        = cancelingCatalog{}
	_ optimistic.LeaseStore = (*hookStore)(nil)
	_ broker.RequestLog     = lostRecord{}
)

// errInjected is the fault the wrappers answer with.
var errInjected = errors.New("injected fault")

const (
	provider = "openai"
	model    = "gpt-4o"
)

// env is a catalog and a lease store on one fresh SQLite file, and the
// Admin that keeps them in step.
type env struct {
	db       *sqlitex.DB // the catalog's and the store's
	cat      *catalog.Cache
	store    *sqlitestore.Store
	requests *requestlog.SQLite
	admin    *broker.Admin
	log      *slog.Logger
}

// newEnv opens a fresh file in t.TempDir and puts keys through Admin.Put,
// so the store is synced with the catalog.
func newEnv(t *testing.T, keys ...catalog.Key) *env {
	t.Helper()
	db, sql := newCatalog(t)
	cat := cache(t, sql)
	store, err := sqlitestore.New(t.Context(), db, nil)
	require.NoError(t, err)
	requests, err := requestlog.NewSQLite(t.Context(), db)
	require.NoError(t, err)
	e := &env{
		db: db, cat: cat, store: store, requests: requests, admin: broker.NewAdmin(cat, store, nil),
		log: slog.New(slog.NewTextHandler(t.Output(), nil)),
	}
	for _, k := range keys {
		_, err := e.admin.Put(t.Context(), k)
		require.NoError(t, err)
	}
	return e
}

// newCatalog opens a fresh file in t.TempDir, closed when the test ends,
// and returns it with the catalog in it.
func newCatalog(t *testing.T) (*sqlitex.DB, *catalog.SQL) {
	t.Helper()
	db := sqlitextest.Temp(t)
	sql, err := catalog.New(t.Context(), db, nil)
	require.NoError(t, err)
	return db, sql
}

// cache returns a Cache over c, closed when the test ends.
func cache(t *testing.T, c *catalog.SQL) *catalog.Cache { return cacheWith(t, c, nil) }

// cacheWith is cache with opts.
func cacheWith(t *testing.T, c *catalog.SQL, opts *catalog.CacheOptions) *catalog.Cache {
	t.Helper()
	cc, err := catalog.NewCache(t.Context(), c, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, cc.Close(context.Background())) })
	return cc
}

// broker returns a Broker over c and s with the default pool order and
// the store's request log.
func (e *env) broker(c broker.Catalog, s optimistic.LeaseStore) *broker.Broker {
	return broker.New(c, s, &broker.Options{Requests: e.requests, Logger: e.log})
}

// plain returns a Broker over the env's own catalog and store.
func (e *env) plain() *broker.Broker { return e.broker(e.cat, e.store) }

// key is an available key of the test provider that serves the test model.
func key(id, pool string, limit int) catalog.Key {
	return catalog.Key{
		ID: id, Provider: provider, Pool: pool, Models: []string{model},
		Secret: catalog.Secret("sk-" + id), Status: optimistic.StatusAvailable, MaxConcurrentUses: limit,
	}
}

// req is an allocate request for the test provider and model.
func req(pool string) broker.Request {
	return broker.Request{Provider: provider, Model: model, Pool: pool, TTL: time.Minute}
}

// info is the store's live view of one key.
func (e *env) info(t *testing.T, id string) optimistic.KeyInfo {
	t.Helper()
	in, err := e.store.Inspect(t.Context(), id)
	require.NoError(t, err)
	return in[0]
}

// live counts the unexpired leases the store holds on a key.
func (e *env) live(t *testing.T, id string) int {
	t.Helper()
	return e.info(t, id).Live
}

// get reads a key from the catalog's database (not the cache's snapshot),
// once the uses the cache holds are written.
func (e *env) get(t *testing.T, id string) catalog.Key {
	t.Helper()
	require.NoError(t, e.cat.Flush(t.Context()))
	k, err := e.cat.SQL.Get(t.Context(), id)
	require.NoError(t, err)
	return k
}

// allocate is one Allocate that must succeed.
func allocate(t *testing.T, b *broker.Broker, r broker.Request) broker.Grant {
	t.Helper()
	g, err := b.Allocate(t.Context(), r)
	require.NoError(t, err)
	return g
}

// capacityError asserts err is a *optimistic.CapacityError and returns it.
func capacityError(t *testing.T, err error) *optimistic.CapacityError {
	t.Helper()
	var full *optimistic.CapacityError
	require.ErrorAs(t, err, &full)
	require.ErrorIs(t, err, optimistic.ErrNoCapacity)
	return full
}

// allocCall is one Allocate the broker made on a hookStore.
type allocCall struct {
	pool    string
	order   []string // the candidates, in the order given
	granted string   // key id, "" if none
	err     error
	waits   bool // marked optimistic.WithWaiting
}

// hookStore is the real lease store with Allocate wrapped: fault, if set,
// may answer instead of the store (nil lets the store answer), and
// granted, if set, runs after a real grant, before the broker sees it.
// Every call is recorded.
type hookStore struct {
	*sqlitestore.Store
	fault   func(req optimistic.AllocateRequest) error
	granted func(l optimistic.Lease)
	// releaseDown makes Release fail as a store outage would while set;
	// downKey, while set, makes the Releases of that key alone fail.
	releaseDown atomic.Bool
	downKey     atomic.Pointer[string]
	// syncDown, while set, makes the SyncKeys of that key fail as a
	// cluster master refusing writes would.
	syncDown atomic.Pointer[string]
	// hung, once set (see hang), makes Release block.
	hung atomic.Pointer[hung]
	// afterHolds, if set, runs after each Holds.
	afterHolds func()
	// inspects counts Inspect calls; inspected holds the ids each read.
	inspects  atomic.Int32
	inspected [][]string
	// inspectGate, if set, runs in each Inspect after it is counted; an
	// error it returns is Inspect's answer.
	inspectGate atomic.Pointer[func() error]
	// afterInspect, if set, may change what each Inspect answers.
	afterInspect func([]optimistic.KeyInfo)

	mu    sync.Mutex
	calls []allocCall
}

// hung holds Releases until the test ends.
type hung struct {
	entered chan struct{} // one send per blocked Release, if there is room
	until   chan struct{} // closed at the end of the test
}

// hang makes every Release from now on block until the test ends,
// whatever its ctx, as a store that hangs and ignores deadlines would. The
// channel returned receives when a Release blocks.
func (s *hookStore) hang(t *testing.T) <-chan struct{} {
	h := &hung{entered: make(chan struct{}, 1), until: make(chan struct{})}
	s.hung.Store(h)
	t.Cleanup(func() { close(h.until) })
	return h.entered
}

func (s *hookStore) Holds(ctx context.Context, ref optimistic.LeaseRef) (time.Time, error) {
	until, err := s.Store.Holds(ctx, ref)
	if s.afterHolds != nil {
		s.afterHolds()
	}
	return until, err
}

func (s *hookStore) Inspect(ctx context.Context, ids ...string) ([]optimistic.KeyInfo, error) {
	s.inspects.Add(1)
	s.mu.Lock()
	s.inspected = append(s.inspected, ids)
	s.mu.Unlock()
	if gate := s.inspectGate.Load(); gate != nil {
		if err := (*gate)(); err != nil {
			return nil, err
		}
	}
	infos, err := s.Store.Inspect(ctx, ids...)
	if err == nil && s.afterInspect != nil {
		s.afterInspect(infos)
	}
	return infos, err
}

func (s *hookStore) SyncKey(ctx context.Context, k optimistic.KeyState) error {
	if d := s.syncDown.Load(); d != nil && *d == k.ID {
		return fmt.Errorf("%w: %w: sync: NOREPLICAS", optimistic.ErrStore, optimistic.ErrUnreachable)
	}
	return s.Store.SyncKey(ctx, k)
}

func (s *hookStore) Release(ctx context.Context, ref optimistic.LeaseRef) error {
	if h := s.hung.Load(); h != nil {
		select {
		case h.entered <- struct{}{}:
		default:
		}
		<-h.until
	}
	if k := s.downKey.Load(); s.releaseDown.Load() || k != nil && *k == ref.KeyID {
		return optimistic.Classify(ctx, "release", errInjected)
	}
	return s.Store.Release(ctx, ref)
}

// twoServers is a hookStore whose key "dead" lives on a server of its
// own, as on a Redis Cluster (see the backlog's nodes).
type twoServers struct{ *hookStore }

func (s twoServers) Node(_ context.Context, keyID string) (string, error) {
	if keyID == "dead" {
		return "dead:6379", nil
	}
	return "live:6379", nil
}

func (s *hookStore) Allocate(ctx context.Context, req optimistic.AllocateRequest) (optimistic.Lease, optimistic.Stats, error) {
	var (
		l   optimistic.Lease
		st  optimistic.Stats
		err error
	)
	if s.fault != nil {
		err = s.fault(req)
	}
	if err == nil {
		l, st, err = s.Store.Allocate(ctx, req)
		if err == nil && s.granted != nil {
			s.granted(l)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, allocCall{pool: req.Pool, order: slices.Clone(req.Candidates), granted: l.KeyID, err: err, waits: optimistic.IsWaiting(ctx)})
	return l, st, err
}

// recorded returns the calls made so far.
func (s *hookStore) recorded() []allocCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]allocCall(nil), s.calls...)
}

// flakyCatalog is the real catalog with faults: the failRead-th read of
// one key, by Get or Key (1-based, 0 never), answers readErr, List answers
// listErr if set, and the first failReports Reports fail as a broken
// database would.
type flakyCatalog struct {
	*catalog.Cache
	failRead int
	readErr  error
	listErr  error
	// failReports is how many Reports to fail before the real ones.
	failReports atomic.Int32
	// beforeQuarantine, if set, runs before each Quarantine.
	beforeQuarantine func(id string)
	// frozen makes Current name the snapshot the last ResolveRecent did,
	// as if the catalog never moved since; currentErr, if set, is
	// Current's answer instead, as a broken database's.
	frozen     bool
	currentErr error
	resolved   atomic.Pointer[catalog.Snapshot]

	mu    sync.Mutex
	reads int
}

// fault counts a read of one key and answers readErr if it is the one to fail.
func (c *flakyCatalog) ResolveRecent(ctx context.Context, provider, model string) (string, catalog.Snapshot, error) {
	canonical, snap, err := c.Cache.ResolveRecent(ctx, provider, model)
	c.resolved.Store(&snap)
	return canonical, snap, err
}

func (c *flakyCatalog) Current(ctx context.Context) (catalog.Snapshot, error) {
	if c.currentErr != nil {
		return catalog.Snapshot{}, c.currentErr
	}
	if snap := c.resolved.Load(); c.frozen && snap != nil {
		return *snap, nil
	}
	return c.Cache.Current(ctx)
}

func (c *flakyCatalog) fault() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	if c.reads == c.failRead {
		return c.readErr
	}
	return nil
}

func (c *flakyCatalog) Get(ctx context.Context, id string) (catalog.Key, error) {
	if err := c.fault(); err != nil {
		return catalog.Key{}, err
	}
	return c.Cache.Get(ctx, id)
}

func (c *flakyCatalog) Key(ctx context.Context, id string) (catalog.Key, error) {
	if err := c.fault(); err != nil {
		return catalog.Key{}, err
	}
	return c.Cache.Key(ctx, id)
}

func (c *flakyCatalog) List(ctx context.Context, provider, pool string) ([]catalog.Key, error) {
	if c.listErr != nil {
		return nil, c.listErr
	}
	return c.Cache.List(ctx, provider, pool)
}

func (c *flakyCatalog) Report(ctx context.Context, id, leaseID string, o catalog.Outcome, retryAfter time.Duration, now time.Time) (catalog.Key, error) {
	if c.failReports.Add(-1) >= 0 {
		return catalog.Key{}, optimistic.Classify(ctx, "report", errInjected)
	}
	return c.Cache.Report(ctx, id, leaseID, o, retryAfter, now)
}

func (c *flakyCatalog) Quarantine(ctx context.Context, id string, until, now time.Time) (catalog.Key, error) {
	if c.beforeQuarantine != nil {
		c.beforeQuarantine(id)
	}
	return c.Cache.Quarantine(ctx, id, until, now)
}

// cancelingCatalog ends the request's context on the first Get, as a
// caller hanging up mid-request does: before reading the real catalog
// with it, or, with afterRead, once the read is done.
type cancelingCatalog struct {
	*catalog.Cache
	cancel    context.CancelFunc
	afterRead bool
}

func (c cancelingCatalog) Get(ctx context.Context, id string) (catalog.Key, error) {
	if c.afterRead {
		defer c.cancel()
	} else {
		c.cancel()
	}
	return c.Cache.Get(ctx, id)
}

// lostRecord is the real request log whose Record fails, as if the
// broker's write after a grant never landed: the id stays claimed.
type lostRecord struct{ *requestlog.SQLite }

func (lostRecord) Record(context.Context, string, string, optimistic.Lease) error {
	return errInjected
}
