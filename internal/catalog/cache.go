package catalog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Cache is the catalog as the request path reads it: a snapshot of every
// key, model and alias in memory, kept current by the catalog's
// generation, and the uses (grants, success and error reports) written
// behind in batches. The writes it does not override go straight to SQL.
//
// Every write transaction that changes keys or aliases, from any process
// sharing the database, takes the next generation with a random stamp and
// stamps the key rows it changes with it (see SQL). The Cache reads the
// generation and its stamp, one row, and when they moved reloads only the
// rows stamped since (everything if the catalog went back to an older
// state, or the Cache is further behind than the catalog remembers):
//
//   - Key, Get, ResolveModel and Current read the generation on every
//     call (one prepared row; concurrent calls share a read that started
//     after they asked, see genCheck): the post-grant re-check sees every
//     change committed before the grant.
//   - List and ResolveRecent trust a snapshot confirmed within MaxAge,
//     unless this process wrote to the catalog since. ResolveRecent names
//     the snapshot it used, so that a request that started from it can
//     ask Current, before it answers from it, whether the catalog moved.
//
// Binaries older than this protocol write the catalog without moving the
// generation: stop them before starting this one on a shared catalog.
//
// The snapshot holds secrets as stored (sealed with the Sealer, when one
// is set), apart from the keys: the keys List returns carry none, and Get
// opens the one it returns.
//
// MarkUsed and the success and error outcomes of Report are summed in
// memory per key (so memory stays bounded by the number of keys) and
// written every FlushEvery, and by Flush and Close; they take no
// generation, and the snapshot reads everyone's counters every
// CountersEvery (this process's last grants it knows at once). A crash
// loses what was not written yet: the last FlushEvery, or all since the
// catalog stopped taking writes. These only rank keys; a lease or a change
// of a key's state is never lost: the outcomes that change it
// (rate_limited, auth_error) are written by Report at once.
//
// A Cache is safe for concurrent use. Close it when done; uses noted after
// Close are not written.
type Cache struct {
	*SQL
	maxAge time.Duration
	log    *slog.Logger
	gen    *sql.Stmt
	checks genCheck  // reads gen, coalescing concurrent requests
	epoch  time.Time // the base of now

	snap   atomic.Pointer[snapshot]
	reload chan struct{} // one reload at a time

	mu sync.Mutex // guards uses and recent
	// uses waits to be written: each key's counts and last grant.
	uses map[string]use
	// recent is this process's last grant of each key, for List.
	recent map[string]time.Time

	stop      context.CancelFunc // ends the writer's work
	done      chan struct{}
	closeOnce sync.Once
}

// CacheOptions configure a Cache; nil means defaults.
type CacheOptions struct {
	// MaxAge is how long List and ResolveRecent trust a snapshot before
	// reading the generation again.
	//
	// default: 100ms
	MaxAge time.Duration
	// FlushEvery is how often uses are written.
	//
	// default: 1s
	FlushEvery time.Duration
	// CountersEvery is how often the snapshot reads every key's counters
	// and last use, written behind by every process.
	//
	// default: 10s
	CountersEvery time.Duration
	// Logger gets a line when a flush (its sums are kept and tried again)
	// or a read of the counters fails; never a secret.
	//
	// default: slog.Default()
	Logger *slog.Logger
}

// snapshot is the catalog at one generation. Only its check fields change
// after it is published.
type snapshot struct {
	gen     int64
	stamp   string
	keys    map[string]Key    // secrets removed
	sealed  map[string]string // secrets as stored
	ids     []string          // every key id, sorted
	pools   map[poolID][]string
	aliases map[alias]string

	// checked is when gen was last found current (Cache.now); writes is
	// SQL.writes then.
	checked, writes atomic.Int64
}

type poolID struct{ provider, pool string }

// flushTimeout bounds one flush by the writer.
const flushTimeout = 10 * time.Second

// NewCache loads the snapshot and starts the writer.
func NewCache(ctx context.Context, s *SQL, opts *CacheOptions) (*Cache, error) {
	var o CacheOptions
	if opts != nil {
		o = *opts
	}
	o.MaxAge = positive(o.MaxAge, 100*time.Millisecond)
	o.FlushEvery = positive(o.FlushEvery, time.Second)
	o.CountersEvery = positive(o.CountersEvery, 10*time.Second)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	gen, err := s.db.PrepareContext(ctx, `SELECT gen, stamp FROM catalog_generation WHERE id = 1`)
	if err != nil {
		return nil, fail(ctx, "prepare", err)
	}
	c := &Cache{
		SQL: s, maxAge: o.MaxAge, log: o.Logger, gen: gen, epoch: time.Now(),
		reload: make(chan struct{}, 1),
		uses:   make(map[string]use), recent: make(map[string]time.Time),
		done: make(chan struct{}),
	}
	c.checks.read = c.readGeneration
	ch, err := s.changesSince(ctx, 0, "")
	if err != nil {
		_ = gen.Close()
		return nil, err
	}
	first := (&snapshot{}).apply(ch)
	first.confirm(c.now(), s.writes.Load())
	c.snap.Store(first)
	wctx, stop := context.WithCancel(context.Background())
	c.stop = stop
	go c.writer(wctx, o.FlushEvery, o.CountersEvery)
	return c, nil
}

// positive is d, or def if d is not positive.
func positive(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// Close stops the writer, then writes what it holds under ctx. Calls after
// the first return nil. After it, a read that needs the generation fails
// (ErrStore): List and ResolveRecent answer from the snapshot until it is
// older than MaxAge, the others fail at once. Uses noted after it are not
// written.
func (c *Cache) Close(ctx context.Context) error {
	var err error
	c.closeOnce.Do(func() {
		c.stop()
		select {
		case <-c.done:
		case <-ctx.Done():
		}
		err = errors.Join(c.Flush(ctx), c.gen.Close())
	})
	return err
}

// List is SQL.List from the snapshot (see Cache for how fresh), with this
// process's latest grants as LastUsedAt. The keys' Models are shared with
// the cache: do not modify them.
func (c *Cache) List(ctx context.Context, provider, pool string) ([]Key, error) {
	s, err := c.current(ctx, false)
	if err != nil {
		return nil, err
	}
	ids := s.ids
	if provider != "" && pool != "" {
		ids = s.pools[poolID{provider, pool}]
	}
	var out []Key
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		k := s.keys[id]
		if (provider == "" || k.Provider == provider) && (pool == "" || k.Pool == pool) {
			if at := c.recent[id]; at.After(k.LastUsedAt) {
				k.LastUsedAt = at
			}
			out = append(out, k)
		}
	}
	return out, nil
}

// Key is SQL.Key from a snapshot of the current generation; its Models
// are shared with the cache.
func (c *Cache) Key(ctx context.Context, id string) (Key, error) {
	_, k, err := c.lookup(ctx, id)
	return k, err
}

// lookup finds id in a snapshot of the current generation.
func (c *Cache) lookup(ctx context.Context, id string) (*snapshot, Key, error) {
	s, err := c.current(ctx, true)
	if err != nil {
		return nil, Key{}, err
	}
	k, ok := s.keys[id]
	if !ok {
		return nil, Key{}, notFound(id)
	}
	return s, k, nil
}

// Get is SQL.Get from a snapshot of the current generation: the secret is
// opened from memory.
func (c *Cache) Get(ctx context.Context, id string) (Key, error) {
	s, k, err := c.lookup(ctx, id)
	if err != nil {
		return Key{}, err
	}
	plain := s.sealed[id]
	if c.sealer != nil {
		if plain, err = c.sealer.open(id, plain); err != nil {
			return Key{}, fail(ctx, fmt.Sprintf("get key %q", id), err)
		}
	}
	k.Secret = Secret(plain)
	return k, nil
}

// Snapshot names the catalog state a Cache read: equal Snapshots are the
// same generation.
type Snapshot struct {
	gen   int64
	stamp string
}

// Current returns the Snapshot of the current generation: it reads the
// generation (see genCheck), and the rows that changed if it moved.
func (c *Cache) Current(ctx context.Context) (Snapshot, error) {
	s, err := c.current(ctx, true)
	if err != nil {
		return Snapshot{}, err
	}
	return Snapshot{s.gen, s.stamp}, nil
}

// ResolveRecent is ResolveModel from the snapshot List reads (see Cache
// for how fresh), without a read of the generation if that snapshot is
// recent; it returns which snapshot that was, so that the caller can ask
// Current whether the catalog moved since.
func (c *Cache) ResolveRecent(ctx context.Context, provider, model string) (string, Snapshot, error) {
	s, err := c.current(ctx, false)
	if err != nil {
		return "", Snapshot{}, err
	}
	return s.resolve(provider, model), Snapshot{s.gen, s.stamp}, nil
}

// ResolveModel returns the canonical model that model names for provider
// (see SQL.SetAlias): its alias target, or model itself when it is no
// alias; from a snapshot of the current generation.
func (c *Cache) ResolveModel(ctx context.Context, provider, model string) (string, error) {
	s, err := c.current(ctx, true)
	if err != nil {
		return "", err
	}
	return s.resolve(provider, model), nil
}

// resolve is model's canonical name for provider in s.
func (s *snapshot) resolve(provider, model string) string {
	if canonical, ok := s.aliases[alias{provider, model}]; ok {
		return canonical
	}
	return model
}

// MarkUsed notes that the key was handed out at at, to be written behind:
// its last_used_at only moves later.
func (c *Cache) MarkUsed(id string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if u := c.uses[id]; at.After(u.lastUsed) {
		u.lastUsed = at
		c.uses[id] = u
	}
	if at.After(c.recent[id]) {
		c.recent[id] = at
	}
}

// Report is SQL.Report, with success and error counted in memory and
// written behind: it checks that the key is in the snapshot as it is,
// counts the outcome and returns the key from the snapshot, without the
// counts not yet written. It reads the catalog only for a key the
// snapshot does not have (another process may have added it since, and
// granted it), so a count of a known key never fails because the catalog
// does. Unlike SQL.Report it does not remember the lease: the caller
// counts each lease once (the broker counts a success or error only when
// its release took the lease back). Other outcomes go to SQL.Report.
func (c *Cache) Report(ctx context.Context, id, leaseID string, o Outcome, retryAfter time.Duration, now time.Time) (Key, error) {
	if (o != OutcomeSuccess && o != OutcomeError) || leaseID == "" {
		return c.SQL.Report(ctx, id, leaseID, o, retryAfter, now)
	}
	// A key deleted after this check is skipped by the flush.
	k, ok := c.snap.Load().keys[id]
	if !ok {
		var err error
		if _, k, err = c.lookup(ctx, id); err != nil {
			return Key{}, err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	u := c.uses[id]
	if o == OutcomeSuccess {
		u.successes++
	} else {
		u.errors++
	}
	c.uses[id] = u
	return k, nil
}

// Flush writes the uses noted so far in one transaction. If it fails they
// are kept for the next flush.
func (c *Cache) Flush(ctx context.Context) error {
	c.mu.Lock()
	uses := c.uses
	c.uses = make(map[string]use)
	c.mu.Unlock()
	if len(uses) == 0 {
		return nil
	}
	err := c.record(ctx, uses)
	if err != nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		for id, u := range uses {
			v := c.uses[id]
			v.successes += u.successes
			v.errors += u.errors
			if u.lastUsed.After(v.lastUsed) {
				v.lastUsed = u.lastUsed
			}
			c.uses[id] = v
		}
	}
	return err
}

func (c *Cache) writer(ctx context.Context, flushEvery, countersEvery time.Duration) {
	defer close(c.done)
	flush, counters := time.NewTicker(flushEvery), time.NewTicker(countersEvery)
	defer flush.Stop()
	defer counters.Stop()
	for {
		var err error
		select {
		case <-ctx.Done():
			return
		case <-flush.C:
			fctx, cancel := context.WithTimeout(ctx, flushTimeout)
			if err = c.Flush(fctx); err != nil {
				err = fmt.Errorf("writing uses failed, kept for the next try: %w", err)
			}
			cancel()
		case <-counters.C:
			rctx, cancel := context.WithTimeout(ctx, flushTimeout)
			if err = c.readAllCounters(rctx); err != nil {
				err = fmt.Errorf("reading counters failed: %w", err)
			}
			cancel()
		}
		if err != nil && ctx.Err() == nil {
			c.log.Warn("catalog cache", "err", err)
		}
	}
}

// readAllCounters brings every process's counters and last uses into the
// snapshot.
func (c *Cache) readAllCounters(ctx context.Context) error {
	select {
	case c.reload <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.reload }()
	all, err := c.readCounters(ctx)
	if err != nil {
		return err
	}
	s := c.snap.Load()
	next := s.copy()
	for id, k := range next.keys {
		if n, ok := all[id]; ok {
			k.Successes, k.Errors, k.RateLimitHits, k.LastUsedAt = n.successes, n.errors, n.rateLimitHits, n.lastUsed
			next.keys[id] = k
		}
	}
	next.checked.Store(s.checked.Load())
	next.writes.Store(s.writes.Load())
	c.snap.Store(next)
	return nil
}

// current returns the snapshot, brought to the current generation if
// verify is set, if it was confirmed longer than maxAge ago, or if this
// process wrote to the catalog since; else as it is.
func (c *Cache) current(ctx context.Context, verify bool) (*snapshot, error) {
	s := c.snap.Load()
	writes := c.writes.Load()
	if !verify && writes == s.writes.Load() && c.since(s.checked.Load()) < c.maxAge {
		return s, nil
	}
	start := c.now()
	g, err := c.checks.get(ctx)
	if err != nil {
		return nil, fail(ctx, "read generation", err)
	}
	if g.gen == s.gen && g.stamp == s.stamp {
		s.confirm(start, writes)
		return s, nil
	}
	return c.refresh(ctx, g.gen, g.stamp)
}

func (c *Cache) readGeneration(ctx context.Context) (generation, error) {
	var g generation
	err := c.gen.QueryRowContext(ctx).Scan(&g.gen, &g.stamp)
	return g, err
}

// refresh brings the snapshot to generation gen, stamped stamp, or a
// later one, reading what changed since the one it has. One reload runs at
// a time; a caller that waited for another's finds its generation reached,
// or reads one row to learn that nothing changed since.
func (c *Cache) refresh(ctx context.Context, gen int64, stamp string) (*snapshot, error) {
	select {
	case c.reload <- struct{}{}:
	case <-ctx.Done():
		return nil, fail(ctx, "reload", ctx.Err())
	}
	defer func() { <-c.reload }()
	s := c.snap.Load()
	if s.gen == gen && s.stamp == stamp {
		return s, nil
	}
	start, writes := c.now(), c.writes.Load()
	ch, err := c.changesSince(ctx, s.gen, s.stamp)
	if err != nil {
		return nil, err
	}
	if ch.gen == s.gen && ch.stamp == s.stamp {
		s.confirm(start, writes)
		return s, nil
	}
	next := s.apply(ch)
	next.confirm(start, writes)
	c.snap.Store(next)
	c.mu.Lock()
	for id := range c.recent {
		if _, ok := next.keys[id]; !ok {
			delete(c.recent, id)
		}
	}
	c.mu.Unlock()
	return next, nil
}

func (s *snapshot) confirm(at time.Duration, writes int64) {
	s.checked.Store(int64(at))
	s.writes.Store(writes)
}

// now is the monotonic time since the cache started: MaxAge holds however
// the wall clock steps.
func (c *Cache) now() time.Duration { return time.Since(c.epoch) }

// since is how long ago checked (a now reading) was.
func (c *Cache) since(checked int64) time.Duration { return c.now() - time.Duration(checked) }

// copy returns s's contents in maps of their own, unconfirmed.
func (s *snapshot) copy() *snapshot {
	return &snapshot{
		gen: s.gen, stamp: s.stamp, keys: maps.Clone(s.keys), sealed: maps.Clone(s.sealed),
		ids: s.ids, pools: s.pools, aliases: s.aliases,
	}
}

// apply returns a new snapshot: s with ch applied.
func (s *snapshot) apply(ch changes) *snapshot {
	next := &snapshot{gen: ch.gen, stamp: ch.stamp, keys: make(map[string]Key), sealed: make(map[string]string), aliases: s.aliases}
	if !ch.all {
		next = s.copy()
		next.gen, next.stamp = ch.gen, ch.stamp
	}
	for _, id := range ch.gone {
		delete(next.keys, id)
		delete(next.sealed, id)
	}
	for _, k := range ch.keys {
		next.sealed[k.ID] = k.Secret.Reveal()
		k.Secret = ""
		next.keys[k.ID] = k
	}
	if ch.aliases != nil {
		next.aliases = ch.aliases
	}
	next.ids = slices.Sorted(maps.Keys(next.keys))
	next.pools = make(map[poolID][]string)
	for _, id := range next.ids {
		p := poolID{next.keys[id].Provider, next.keys[id].Pool}
		next.pools[p] = append(next.pools[p], id)
	}
	return next
}
