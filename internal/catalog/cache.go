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
// Every write transaction on the catalog, from any process sharing its
// database, takes the next generation and stamps the rows it changes with
// it (see SQL). The Cache reads the generation, one indexed row, and when
// it has moved reloads only the rows stamped since:
//
//   - Key, Get and ResolveModel read the generation on every call (a few
//     microseconds): a request, which resolves its model first, sees every
//     change committed before it started, and the post-grant re-check
//     every change committed before the grant.
//   - List trusts a snapshot confirmed within MaxAge, unless this process
//     wrote to the catalog since: called after ResolveModel, it lists the
//     catalog as of the request's start without a read of its own.
//
// The snapshot holds secrets as stored (sealed), apart from the keys:
// the keys List returns carry none, and Get opens the one it returns.
//
// MarkUsed and the success and error outcomes of Report are kept in memory
// and written every FlushEvery, and by Flush and Close. A crash loses those
// of the last FlushEvery (counters and last_used_at, which only rank keys);
// never a lease, and never a change of a key's state: the outcomes that
// change it (rate_limited, auth_error) are written by Report at once.
//
// A Cache is safe for concurrent use. Close it once, to stop the writer.
type Cache struct {
	*SQL
	maxAge time.Duration
	log    *slog.Logger
	gen    *sql.Stmt

	snap   atomic.Pointer[snapshot]
	reload chan struct{} // one reload at a time

	mu      sync.Mutex // guards reports and used
	reports map[string]report
	used    map[string]time.Time

	stop chan struct{}
	done chan struct{}
}

// CacheOptions configure a Cache; nil means defaults.
type CacheOptions struct {
	// MaxAge is how long List trusts a snapshot before reading the
	// generation again.
	//
	// default: 100ms
	MaxAge time.Duration
	// FlushEvery is how often uses are written.
	//
	// default: 1s
	FlushEvery time.Duration
	// Logger gets a line when a flush fails (the batch is kept and tried
	// again); key ids only.
	//
	// default: slog.Default()
	Logger *slog.Logger
}

// snapshot is the catalog at one generation. Only its check fields change
// after it is published.
type snapshot struct {
	gen     int64
	keys    map[string]Key      // secrets removed
	sealed  map[string]string   // secrets as stored
	ids     []string            // every key id, sorted
	pools   map[poolID][]string // ids of each provider's pool, sorted
	aliases map[alias]string

	// checked is when gen was last found current (unix ns); writes is
	// SQL.writes then.
	checked, writes atomic.Int64
}

type poolID struct{ provider, pool string }

// NewCache loads the snapshot and starts the writer.
func NewCache(ctx context.Context, s *SQL, opts *CacheOptions) (*Cache, error) {
	var o CacheOptions
	if opts != nil {
		o = *opts
	}
	if o.MaxAge <= 0 {
		o.MaxAge = 100 * time.Millisecond
	}
	if o.FlushEvery <= 0 {
		o.FlushEvery = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	gen, err := s.db.PrepareContext(ctx, `SELECT gen FROM catalog_generation WHERE id = 1`)
	if err != nil {
		return nil, fail(ctx, "prepare", err)
	}
	c := &Cache{
		SQL: s, maxAge: o.MaxAge, log: o.Logger, gen: gen,
		reload:  make(chan struct{}, 1),
		reports: make(map[string]report), used: make(map[string]time.Time),
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	c.snap.Store(&snapshot{})
	if _, err := c.refresh(ctx, 1); err != nil {
		_ = gen.Close()
		return nil, err
	}
	go c.writer(o.FlushEvery)
	return c, nil
}

// Close stops the writer and flushes what it holds under ctx.
func (c *Cache) Close(ctx context.Context) error {
	close(c.stop)
	<-c.done
	err := c.Flush(ctx)
	return errors.Join(err, c.gen.Close())
}

// List is SQL.List from the snapshot (see Cache for how fresh). The keys'
// Models are shared with the cache: do not modify them.
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
	for _, id := range ids {
		k := s.keys[id]
		if (provider == "" || k.Provider == provider) && (pool == "" || k.Pool == pool) {
			out = append(out, k)
		}
	}
	return out, nil
}

// Key is SQL.Key from a snapshot of the current generation.
func (c *Cache) Key(ctx context.Context, id string) (Key, error) {
	s, err := c.current(ctx, true)
	if err != nil {
		return Key{}, err
	}
	k, ok := s.keys[id]
	if !ok {
		return Key{}, notFound(id)
	}
	return k, nil
}

// Get is SQL.Get from a snapshot of the current generation: the secret is
// opened from memory.
func (c *Cache) Get(ctx context.Context, id string) (Key, error) {
	s, err := c.current(ctx, true)
	if err != nil {
		return Key{}, err
	}
	k, ok := s.keys[id]
	if !ok {
		return Key{}, notFound(id)
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

// ResolveModel is SQL.ResolveModel from a snapshot of the current
// generation.
func (c *Cache) ResolveModel(ctx context.Context, provider, model string) (string, error) {
	s, err := c.current(ctx, true)
	if err != nil {
		return "", err
	}
	if canonical, ok := s.aliases[alias{provider, model}]; ok {
		return canonical, nil
	}
	return model, nil
}

// MarkUsed notes that the key was handed out at at, to be written behind:
// its last_used_at only moves later.
func (c *Cache) MarkUsed(id string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if at.After(c.used[id]) {
		c.used[id] = at
	}
}

// Report is SQL.Report, with success and error written behind: it checks
// the arguments and that the key is in the snapshot (as List sees it: a
// key deleted meanwhile is skipped by the flush), notes the outcome and
// returns the key from the snapshot, without the counts not yet written.
// A lease reported again before the flush counts once, as do the other
// outcomes of a lease whose success or error waits to be written.
func (c *Cache) Report(ctx context.Context, id, leaseID string, o Outcome, retryAfter time.Duration, now time.Time) (Key, error) {
	c.mu.Lock()
	_, pending := c.reports[leaseID]
	c.mu.Unlock()
	if (o != OutcomeSuccess && o != OutcomeError && !pending) || leaseID == "" {
		return c.SQL.Report(ctx, id, leaseID, o, retryAfter, now)
	}
	s, err := c.current(ctx, false)
	if err != nil {
		return Key{}, err
	}
	k, ok := s.keys[id]
	if !ok {
		return Key{}, notFound(id)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.reports[leaseID]; !ok {
		c.reports[leaseID] = report{keyID: id, outcome: o, at: now}
	}
	return k, nil
}

// Flush writes the uses noted so far in one transaction. On failure they
// are kept for the next flush.
func (c *Cache) Flush(ctx context.Context) error {
	c.mu.Lock()
	reports, used := c.reports, c.used
	c.reports, c.used = make(map[string]report), make(map[string]time.Time)
	c.mu.Unlock()
	if len(reports) == 0 && len(used) == 0 {
		return nil
	}
	err := c.record(ctx, reports, used)
	if err != nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		for id, r := range reports {
			if _, ok := c.reports[id]; !ok {
				c.reports[id] = r
			}
		}
		for id, at := range used {
			if at.After(c.used[id]) {
				c.used[id] = at
			}
		}
	}
	return err
}

// flushTimeout bounds one flush by the writer.
const flushTimeout = 10 * time.Second

func (c *Cache) writer(every time.Duration) {
	defer close(c.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
		if err := c.Flush(ctx); err != nil {
			c.log.Warn("catalog: writing uses failed; kept for the next try", "err", err)
		}
		cancel()
	}
}

// current returns the snapshot, brought to the current generation if
// verify is set, if it was confirmed longer than maxAge ago, or if this
// process wrote to the catalog since; else as it is.
func (c *Cache) current(ctx context.Context, verify bool) (*snapshot, error) {
	s := c.snap.Load()
	writes := c.writes.Load()
	if !verify && writes == s.writes.Load() && time.Since(time.Unix(0, s.checked.Load())) < c.maxAge {
		return s, nil
	}
	start := time.Now()
	var gen int64
	if err := c.gen.QueryRowContext(ctx).Scan(&gen); err != nil {
		return nil, fail(ctx, "read generation", err)
	}
	if gen == s.gen {
		s.confirm(start, writes)
		return s, nil
	}
	return c.refresh(ctx, gen)
}

// refresh brings the snapshot to generation gen or later, reading what
// changed since the one it has; concurrent callers share one reload.
// A generation that went back (a catalog restored from a backup) reloads
// everything.
func (c *Cache) refresh(ctx context.Context, gen int64) (*snapshot, error) {
	select {
	case c.reload <- struct{}{}:
	case <-ctx.Done():
		return nil, fail(ctx, "reload", ctx.Err())
	}
	defer func() { <-c.reload }()
	s := c.snap.Load()
	if s.gen == gen {
		return s, nil
	}
	start, writes := time.Now(), c.writes.Load()
	ch, err := c.changesSince(ctx, s.gen)
	if err != nil {
		return nil, err
	}
	next := s.apply(ch)
	next.confirm(start, writes)
	c.snap.Store(next)
	return next, nil
}

func (s *snapshot) confirm(at time.Time, writes int64) {
	s.checked.Store(at.UnixNano())
	s.writes.Store(writes)
}

// apply returns a new snapshot: s with ch applied.
func (s *snapshot) apply(ch changes) *snapshot {
	next := &snapshot{gen: ch.gen, keys: make(map[string]Key), sealed: make(map[string]string), aliases: s.aliases}
	if !ch.all {
		maps.Copy(next.keys, s.keys)
		maps.Copy(next.sealed, s.sealed)
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
