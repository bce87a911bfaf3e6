// Package broker is one allocate request end to end: pick the pools in
// fallback order, filter the catalog's keys, rank them (weights and
// jitter, rank.go), lease a slot from the store, repair the store's view
// from the catalog when it answers "full" the first time, then re-check the
// catalog before handing out the credential and give the slot back if the
// key was disabled, moved or deleted meanwhile (or the model's alias
// moved), and answer "no grant" only from the current catalog. It also
// serves renew, report and release, and key administration (Admin).
package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/requestlog"
	"github.com/credpool/credpool/optimistic"
)

// The broker's own outcomes; the store's (optimistic.ErrNoCapacity,
// ErrContended, ErrStore, ErrInvalid) pass through unchanged.
var (
	// ErrNoCandidates means the provider has no keys at all in the
	// requested pool or its fallbacks.
	ErrNoCandidates = errors.New("broker: no keys for this provider and pool")
	// ErrPolicy means keys exist but the request conflicts with policy:
	// none of them serves the requested model.
	ErrPolicy = errors.New("broker: request conflicts with policy")
	// ErrCatalog wraps a failure of the catalog database.
	ErrCatalog = errors.New("broker: catalog unavailable")
	// ErrShuttingDown means a request that waits for a slot (Request.Wait)
	// found none before the service began to shut down (StopWaiting). It
	// holds no slot; another instance may have one.
	ErrShuttingDown = errors.New("broker: shutting down: no more waiting for a slot here")
)

// Catalog is what the broker needs from the key catalog.
type Catalog interface {
	List(ctx context.Context, provider, pool string) ([]catalog.Key, error)
	// Get reads a key with its secret: only to hand the secret out.
	Get(ctx context.Context, id string) (catalog.Key, error)
	// Key reads a key without its secret: to check its state.
	Key(ctx context.Context, id string) (catalog.Key, error)
	ResolveModel(ctx context.Context, provider, model string) (string, error)
	// ResolveRecent is ResolveModel from a recent snapshot, read without
	// the generation if recent (see catalog.Cache), and names it.
	ResolveRecent(ctx context.Context, provider, model string) (string, catalog.Snapshot, error)
	// Current reads the generation and names the current snapshot.
	Current(ctx context.Context) (catalog.Snapshot, error)
	// MarkUsed notes that a key was handed out, written behind
	// (catalog.Cache): nothing on the request path waits for it.
	MarkUsed(id string, at time.Time)
	RecoverCooldown(ctx context.Context, id string, now time.Time) (bool, error)
	Report(ctx context.Context, id, leaseID string, o catalog.Outcome, retryAfter time.Duration, now time.Time) (catalog.Key, error)
	syncCatalog
}

// RequestLog remembers which lease answered an allocate request id, so a
// retried request gets the same lease back instead of a second slot.
// requestlog.Redis and requestlog.SQLite implement it; see that package
// for what each call promises.
type RequestLog interface {
	// Claim reserves id for the caller holding token, or returns the
	// lease that answered it, requestlog.ErrInFlight or
	// requestlog.ErrReused.
	Claim(ctx context.Context, id, token, fingerprint string, ttl time.Duration) (e requestlog.Entry, claimed bool, err error)
	// Record stores the lease that answered id, held by token.
	Record(ctx context.Context, id, token string, l optimistic.Lease) error
	// Forget frees id if token holds it.
	Forget(ctx context.Context, id, token string) error
	// Extend keeps the record of a lease until its new expiry.
	Extend(ctx context.Context, leaseID string, until time.Time) error
}

// Options configure a Broker; nil means defaults.
type Options struct {
	// Requests makes request ids idempotent; without it a request that
	// carries one is rejected as invalid.
	//
	// default: nil
	Requests RequestLog
	// Weights rank candidates.
	//
	// default: DefaultWeights()
	Weights *Weights
	// Pools is the pool fallback order; check it with PoolOrder.Check (the
	// Broker does not: it only tries a pool's own fallbacks, one step).
	//
	// default: DefaultPoolOrder() (vip borrows default)
	Pools PoolOrder
	// Inspect is how many of a pool's candidates, the best by the catalog,
	// are ranked again with their live state, per allocate (see rank;
	// LiveMaxAge says when it is read from the store). More ranks by live
	// capacity over more keys; each read costs two commands in one round
	// trip.
	//
	// default: DefaultInspect (4); negative: every candidate
	Inspect int
	// LiveMaxAge is how long a key's live state, once read, ranks it
	// without being read again: kept up meanwhile by this process's own
	// grants and releases, and read again in the background once older
	// (the allocate that finds it so uses it as it is), or before it
	// ranks once four times older. A key the store passed over (full, or
	// busy with another call) counts one slot busier until then; after an
	// allocate that found no free slot, the next reads its keys again.
	// Ranking is all it decides: the store checks every grant against its
	// own state. Longer saves more round trips; shorter ranks closer to
	// what other processes do.
	//
	// default: DefaultLiveMaxAge (100ms); negative: read on every allocate
	LiveMaxAge time.Duration
	// MaxLease is the longest lease granted or renewed to. It also bounds
	// how long a key the lease store lost is held back (see Losses): a
	// lease the store forgot may be in use for up to that long. Shorter
	// means faster recovery after a loss and more frequent renewals for
	// long work.
	//
	// default: DefaultMaxLease (1h)
	MaxLease time.Duration
	// Losses counts keys the store lost; give the Broker and its Admin the
	// same one.
	//
	// default: a counter of the Broker's own
	Losses *Losses
	// StoreID names the lease store in the catalog's record of which keys
	// reached it, so that a key last synced to another store (a move to
	// another Redis, say), whose leases may still be in use, is held
	// back, and the log tells that from a loss of this store's data. Give
	// the Broker and its Admin the same one (NewStoreID).
	//
	// default: one fixed empty name
	StoreID *StoreID
	// Logger receives one line per decision worth knowing (a grant given
	// back, a cache repair). It logs key and lease ids, never secrets.
	//
	// default: slog.Default()
	Logger *slog.Logger
}

func (o *Options) withDefaults() Options {
	var out Options
	if o != nil {
		out = *o
	}
	if out.MaxLease <= 0 {
		out.MaxLease = DefaultMaxLease
	}
	switch {
	case out.Inspect == 0:
		out.Inspect = DefaultInspect
	case out.Inspect < 0:
		out.Inspect = math.MaxInt
	}
	if out.LiveMaxAge == 0 {
		out.LiveMaxAge = DefaultLiveMaxAge
	}
	if out.Losses == nil {
		out.Losses = NewLosses()
	}
	if out.StoreID == nil {
		out.StoreID = fixedStoreID("")
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

// Defaults of Options.
const (
	DefaultInspect    = 4
	DefaultLiveMaxAge = 100 * time.Millisecond
)

// Broker serves allocate requests. It is safe for concurrent use. Close
// it to stop retrying releases in the background.
type Broker struct {
	syncer[Catalog]
	requests RequestLog
	weights  Weights
	pools    PoolOrder
	inspect  int
	live     *live
	backlog  *backlog
	waits    waits
	// unopenedKeys holds, by key id, until when a key whose secret did not
	// open here is ranked last (see confirm).
	unopenedKeys sync.Map // key id → time.Time

	mu  sync.Mutex // guards rng
	rng *rand.Rand
}

// New returns a Broker over a catalog and a lease store.
func New(c Catalog, s optimistic.LeaseStore, opts *Options) *Broker {
	o := opts.withDefaults()
	live := newLive(s, o.LiveMaxAge, o.Logger)
	backlog := newBacklog(s, o.Logger)
	backlog.released = live.released
	b := &Broker{
		syncer:   newSyncer(c, s, o),
		requests: o.Requests, weights: DefaultWeights(), pools: o.Pools, inspect: o.Inspect,
		live: live, backlog: backlog,
		rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
	}
	if o.Weights != nil {
		b.weights = *o.Weights
	}
	if b.pools == nil {
		b.pools = DefaultPoolOrder()
	}
	return b
}

// Close stops reading keys' live state in the background, and retrying
// failed releases, after one last try under ctx. Releases still failing
// are left to expire.
func (b *Broker) Close(ctx context.Context) {
	b.live.close(ctx)
	b.backlog.close(ctx)
}

// Backlog reports the releases that met a store failure and are retried
// in the background.
func (b *Broker) Backlog() Backlog { return b.backlog.stats() }

// LiveReads counts how the keys' live state that ranks allocates was
// come by: kept, read by an allocate, or read in the background.
func (b *Broker) LiveReads() LiveReads { return b.live.reads() }

// Waiting reports how many allocate requests wait in line for a slot (0
// if the store cannot wait).
func (b *Broker) Waiting() int {
	if w, ok := b.store.(optimistic.Waiter); ok {
		return w.Waiting()
	}
	return 0
}

// Request asks for one credential.
type Request struct {
	Provider string
	// Model is the model the caller wants; aliases are resolved.
	Model string
	Pool  string
	TTL   time.Duration
	// RequestID, if set, makes the request idempotent: the same provider
	// and id again while the lease lives returns that lease (renewed to
	// TTL), not a second slot; with another pool or model it is
	// requestlog.ErrReused.
	RequestID string
	// Wait, when positive, is how long to wait for a slot when every pool
	// is full, in line with this process's other waiting callers (see
	// allocate); ctx bounds it too. The store must be an
	// optimistic.Waiter.
	Wait time.Duration
}

// Grant is a leased credential.
type Grant struct {
	optimistic.Lease
	// Model is the canonical model to ask the provider for.
	Model  string
	Secret catalog.Secret
	// Stats sum the store's work over every allocate call made.
	Stats optimistic.Stats
}

// Allocate leases a key for req. Errors: ErrNoCandidates (no keys in the
// pools), ErrPolicy (no key serves the model, or none of those that do is
// usable or will be by itself), a *optimistic.CapacityError (keys serve
// the model but none has a slot now; FreeAt is the earliest lease expiry or
// cooldown end), optimistic.ErrContended, requestlog.ErrInFlight or
// requestlog.ErrReused (request ids), optimistic.ErrStore, ErrCatalog,
// optimistic.ErrInvalid, ErrShuttingDown (a wait that StopWaiting ended),
// or ctx's error.
// On error no lease is held, except one whose grant reply the store lost
// (see optimistic.Store.Allocate): it expires by itself.
func (b *Broker) Allocate(ctx context.Context, req Request) (Grant, error) {
	if err := b.validate(req); err != nil {
		return Grant{}, err
	}
	if req.RequestID != "" && b.requests == nil {
		return Grant{}, fmt.Errorf("%w: request_id: not supported by this lease store", optimistic.ErrInvalid)
	}
	if !req.recent() {
		// A request that may wait long, or whose id records the model it
		// was served on, starts from the current catalog.
		model, err := b.catalog.ResolveModel(ctx, req.Provider, req.Model)
		if err != nil {
			return Grant{}, catalogErr(ctx, "resolve model", err)
		}
		return b.allocateModel(ctx, req, model)
	}
	// The catalog as recently read, without a read of its own: a grant is
	// re-checked against the current catalog (confirm), and an answer of
	// no grant is given only if the catalog did not move since (a caller
	// that left gets it as it is).
	model, snap, err := b.catalog.ResolveRecent(ctx, req.Provider, req.Model)
	if err != nil {
		return Grant{}, catalogErr(ctx, "resolve model", err)
	}
	g, err := b.allocateModel(ctx, req, model)
	if fromSnapshot(err) && ctx.Err() == nil {
		g, err = b.again(ctx, req, snap, g.Stats, err)
	}
	if errors.Is(err, errAliasMoved) {
		// It moved again while the request ran on the current catalog.
		err = fmt.Errorf("%w: the model's alias changed while allocating", optimistic.ErrContended)
	}
	return g, err
}

// again answers a request that started from snapshot snap and got err, an
// answer of no grant, from the current catalog: err as it is if the
// catalog did not move since, else what the allocate gets on the current
// one. st is the store's work so far.
func (b *Broker) again(ctx context.Context, req Request, snap catalog.Snapshot, st optimistic.Stats, err error) (Grant, error) {
	now, cerr := b.catalog.Current(ctx)
	switch {
	case cerr != nil:
		return Grant{Stats: st}, catalogErr(ctx, "read generation", cerr)
	case now == snap:
		return Grant{Stats: st}, err
	}
	model, _, cerr := b.catalog.ResolveRecent(ctx, req.Provider, req.Model)
	if cerr != nil {
		return Grant{Stats: st}, catalogErr(ctx, "resolve model", cerr)
	}
	g, err := b.allocateModel(ctx, req, model)
	g.Stats.Add(st)
	return g, err
}

// recent reports whether req starts from a recent snapshot of the catalog
// (see Allocate): not if it may wait, nor if it carries a request id (a
// replay must match the model the id was first served on).
func (r Request) recent() bool { return r.Wait <= 0 && r.RequestID == "" }

// errAliasMoved is confirm's answer when the model's alias changed in the
// catalog since a request that started from a recent snapshot resolved it:
// the grant was given back, and the request is answered from the current
// catalog.
var errAliasMoved = errors.New("broker: the model's alias changed")

// fromSnapshot reports whether err is an answer of no grant that a newer
// catalog may change: no keys, policy, full, or a moved alias.
func fromSnapshot(err error) bool {
	return errors.Is(err, ErrNoCandidates) || errors.Is(err, ErrPolicy) ||
		errors.Is(err, optimistic.ErrNoCapacity) || errors.Is(err, errAliasMoved)
}

// allocateModel is Allocate for the canonical model.
func (b *Broker) allocateModel(ctx context.Context, req Request, model string) (Grant, error) {
	if req.RequestID == "" {
		return b.allocate(ctx, req, model)
	}
	return b.allocateOnce(ctx, req, model)
}

// claimWindow is how long a request id stays claimed when ctx sets no
// deadline; with one, the claim lasts until it plus claimMargin. Either way
// the claim outlives the allocation it guards.
const (
	claimWindow = 30 * time.Second
	claimMargin = 5 * time.Second
)

// allocateOnce is Allocate for a request with an id: a replay gets the
// recorded lease, renewed; a first request allocates and records. The
// caller's token tells its own claim from another's, so a claim whose
// reply was lost and re-sent still counts as its own.
func (b *Broker) allocateOnce(ctx context.Context, req Request, model string) (Grant, error) {
	id := req.Provider + "/" + req.RequestID
	// What a replay must match: the lease's pool and model. The TTL may
	// differ, since a replay renews to it.
	fingerprint := req.Pool + "|" + model
	token := uuid.NewString()
	window := claimWindow + req.Wait
	if dl, ok := ctx.Deadline(); ok {
		window = time.Until(dl) + claimMargin
	}
	for range 2 {
		prior, claimed, err := b.requests.Claim(ctx, id, token, fingerprint, window)
		if err != nil {
			return Grant{}, err
		}
		if claimed {
			g, err := b.allocate(ctx, req, model)
			if err != nil {
				b.forget(ctx, id, token)
				return g, err
			}
			if err := b.requests.Record(ctx, id, token, g.Lease); err != nil {
				b.log.WarnContext(ctx, "record request id", "key_id", g.KeyID, "lease_id", g.LeaseID, "err", err)
			}
			return g, nil
		}
		g, err := b.replay(ctx, prior.Lease, model, req.TTL)
		if !errors.Is(err, optimistic.ErrLeaseLost) {
			return g, err
		}
		// The recorded lease is gone: the id is free again.
		b.forget(ctx, id, prior.Token)
	}
	return Grant{}, requestlog.ErrInFlight
}

// replay hands out a recorded lease again, renewed to ttl, if its key
// still backs it and serves model (a fresh grant's re-check would refuse
// it otherwise: see poolRun.confirm).
func (b *Broker) replay(ctx context.Context, l optimistic.Lease, model string, ttl time.Duration) (Grant, error) {
	until, k, err := b.renew(ctx, l.LeaseRef, ttl, b.catalog.Get)
	if err != nil {
		return Grant{}, err
	}
	if !k.Supports(model) {
		return Grant{}, b.revoke(ctx, l.LeaseRef, "key no longer serves the model")
	}
	l.Until = until
	return Grant{Lease: l, Model: model, Secret: k.Secret}, nil
}

func (b *Broker) forget(ctx context.Context, id, token string) {
	ctx, cancel := detach(ctx)
	defer cancel()
	if err := b.requests.Forget(ctx, id, token); err != nil {
		b.log.WarnContext(ctx, "forget request id", "err", err)
	}
}

// awaitKeys bounds the keys a waiting request listens on: a pool of
// thousands of keys is seldom full, and its other keys are seen at the
// next poll (optimistic.WaitPoll).
const awaitKeys = 64

// allocate runs the broker flow over the pools in fallback order, and with
// req.Wait runs it again each time a slot may have freed up on a key of
// those pools that serves the model, until it grants or the wait ends, so
// that a waiting request may be served by a fallback pool too.
func (b *Broker) allocate(ctx context.Context, req Request, model string) (Grant, error) {
	if req.Wait <= 0 {
		return b.allocatePools(ctx, req, model)
	}
	w, ok := b.store.(optimistic.Waiter)
	if !ok {
		return Grant{}, fmt.Errorf("%w: wait: this lease store cannot wait for a slot", optimistic.ErrInvalid)
	}
	until := time.Now().Add(req.Wait)
	ctx = optimistic.WithWaiting(ctx)
	var st optimistic.Stats
	if w.Waiting() == 0 {
		// Nobody waits here: no need to listen for a free slot first (see
		// optimistic.AllocateWaiting).
		g, err := b.allocatePools(ctx, req, model)
		if !optimistic.NotYet(err) {
			return g, err
		}
		st.Add(g.Stats)
	}
	keys, err := b.servingKeys(ctx, req, model)
	if err != nil {
		return Grant{}, err
	}
	p, err := w.Await(ctx, keys)
	if err != nil {
		return Grant{}, err
	}
	defer p.Leave()
	b.waits.add(p)
	defer b.waits.remove(p)
	// A release in this process may hand the request a slot of its own
	// pool: confirmed against the catalog as a grant of the store is.
	p.Offer(req.Provider, req.Pool, req.TTL)
	var g Grant
	for {
		err = p.Retry(ctx, until, func(ctx context.Context) error {
			var err error
			g, err = b.allocatePools(ctx, req, model)
			st.Add(g.Stats)
			return err
		})
		lease, handed := p.Handed()
		if !handed {
			break
		}
		g = Grant{Model: model}
		run := poolRun{Broker: b, req: req, pool: req.Pool, model: model, grant: &g}
		if err != nil {
			run.giveBack(ctx, lease, "request ended")
			break
		}
		b.live.granted(lease.KeyID, time.Now())
		ok, cerr := run.confirm(ctx, lease)
		if ok || cerr != nil {
			err = cerr
			break
		}
		// Given back: the request waits on.
	}
	st.Waited = p.Waited()
	g.Stats = st
	return g, err
}

// servingKeys returns the ids of up to awaitKeys keys of req's pools, in
// fallback order, that serve model.
func (b *Broker) servingKeys(ctx context.Context, req Request, model string) ([]string, error) {
	var out []string
	for _, pool := range b.pools.Sequence(req.Pool) {
		keys, err := b.catalog.List(ctx, req.Provider, pool)
		if err != nil {
			return nil, catalogErr(ctx, "list keys", err)
		}
		for _, k := range keys {
			if len(out) == awaitKeys {
				return out, nil
			}
			if k.Supports(model) {
				out = append(out, k.ID)
			}
		}
	}
	return out, nil
}

// allocatePools is one pass of the broker flow over the pools in fallback
// order.
func (b *Broker) allocatePools(ctx context.Context, req Request, model string) (Grant, error) {
	var (
		g         = Grant{Model: model}
		anyKey    bool
		serving   bool
		gone      bool // a granted key was found gone (see poolRun.gone)
		contended bool
		down      error                    // the first pool that met an unreachable server
		unopened  error                    // the first pool that passed over a secret that does not open here
		stuck     int                      // releases on full candidates that wait for the store
		wait      optimistic.CapacityError // the soonest a slot frees up
	)
	for _, pool := range b.pools.Sequence(req.Pool) {
		keys, err := b.catalog.List(ctx, req.Provider, pool)
		if err != nil {
			return Grant{}, catalogErr(ctx, "list keys", err)
		}
		p := poolRun{Broker: b, req: req, pool: pool, model: model, grant: &g}
		cands, served := p.candidates(ctx, keys)
		anyKey = anyKey || len(keys) > 0
		serving = serving || served
		if len(cands) == 0 {
			wait = sooner(wait, p.wait)
			continue
		}
		err = p.allocate(ctx, cands)
		wait = sooner(wait, p.wait)
		gone = gone || p.gone
		var full *optimistic.CapacityError
		switch {
		case err == nil:
			return g, nil
		case errors.As(err, &full):
			wait = sooner(wait, *full)
			stuck += b.backlog.stuck(ids(cands)...)
		case errors.Is(err, ErrCatalog) && !errors.Is(err, catalog.ErrSecret):
			// A catalog locked past its retries is contended too, but it
			// is the catalog's failure (503), not a hot pool.
			return Grant{Stats: g.Stats}, err
		case errors.Is(err, optimistic.ErrContended):
			// A hot pool is no reason to skip its fallbacks.
			contended = true
		case errors.Is(err, optimistic.ErrUnreachable):
			// Nor is a pool whose free keys may be on a server that is down:
			// the fallbacks' may answer.
			down = cmp.Or(down, err)
		case errors.Is(err, catalog.ErrSecret):
			// Nor a key this instance cannot hand out.
			unopened = cmp.Or(unopened, err)
		default:
			return Grant{Stats: g.Stats}, err
		}
	}
	pools := b.pools.Sequence(req.Pool)
	if gone {
		// The pools as listed had a key that is gone now: the answer is
		// the one the catalog gives now (a request that started from a
		// recent snapshot would get it from again; one that waits or
		// carries an id reads the catalog only at its start).
		var err error
		if anyKey, serving, err = b.serves(ctx, req.Provider, model, pools); err != nil {
			return Grant{Stats: g.Stats}, err
		}
	}
	switch {
	case !anyKey:
		return Grant{}, fmt.Errorf("%w: provider %s, pools %v", ErrNoCandidates, req.Provider, pools)
	case !serving:
		return Grant{}, fmt.Errorf("%w: no key of provider %s in pools %v serves model %s", ErrPolicy, req.Provider, pools, model)
	case stuck > 0:
		// "Full" would blame the callers for slots the store failed to
		// give back, and still fails to: the store is the problem.
		return Grant{Stats: g.Stats}, fmt.Errorf("%w: %d releases on these keys wait for the store to recover", optimistic.ErrStore, stuck)
	case down != nil:
		// Full would be a lie: the keys that could not be reached may have
		// room.
		return Grant{Stats: g.Stats}, down
	case unopened != nil:
		// Nor when a key passed over may have room.
		return Grant{Stats: g.Stats}, unopened
	case contended:
		return Grant{Stats: g.Stats}, fmt.Errorf("%w: provider %s, pools %v", optimistic.ErrContended, req.Provider, pools)
	case wait.FreeAt.IsZero():
		// Full would be a lie: nothing frees up until an operator acts.
		return Grant{Stats: g.Stats}, fmt.Errorf("%w: no key of provider %s in pools %v that serves model %s is usable (all disabled, pending, exhausted, or cooling down with no end set)", ErrPolicy, req.Provider, pools, model)
	}
	return Grant{Stats: g.Stats}, &wait
}

// serves reports whether pools have any key of provider, and whether any
// of them serves model, as allocatePools counts them.
func (b *Broker) serves(ctx context.Context, provider, model string, pools []string) (anyKey, serving bool, err error) {
	for _, pool := range pools {
		keys, err := b.catalog.List(ctx, provider, pool)
		if err != nil {
			return false, false, catalogErr(ctx, "list keys", err)
		}
		anyKey = anyKey || len(keys) > 0
		serving = serving || slices.ContainsFunc(keys, func(k catalog.Key) bool { return k.Supports(model) })
	}
	return anyKey, serving, nil
}

func ids(keys []catalog.Key) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.ID
	}
	return out
}

func (b *Broker) validate(req Request) error {
	if err := (optimistic.AllocateRequest{Provider: req.Provider, Pool: req.Pool, TTL: req.TTL}).Validate(); err != nil {
		return err
	}
	if err := b.checkTTL(req.TTL); err != nil {
		return err
	}
	if err := catalog.CheckModel("model", req.Model); err != nil {
		return err
	}
	if req.Wait < 0 {
		return fmt.Errorf("%w: wait %v: want zero (do not wait) or more", optimistic.ErrInvalid, req.Wait)
	}
	if req.RequestID != "" && !optimistic.ValidID(req.RequestID) {
		return fmt.Errorf("%w: request_id: want 1-128 characters of [A-Za-z0-9._-]", optimistic.ErrInvalid)
	}
	return nil
}

// checkTTL refuses a lease longer than MaxLease, granted or renewed to.
func (b *Broker) checkTTL(ttl time.Duration) error {
	if ttl > b.maxLease {
		return fmt.Errorf("%w: lease ttl %v: want at most %v", optimistic.ErrInvalid, ttl, b.maxLease)
	}
	return nil
}

// catalogErr keeps cancellation apart from a catalog failure, and passes
// through the catalog's answers (not found, invalid argument).
func catalogErr(ctx context.Context, op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, catalog.ErrNotFound), errors.Is(err, catalog.ErrAliasNotFound), errors.Is(err, optimistic.ErrInvalid):
		return err
	case ctx.Err() != nil:
		return errors.Join(fmt.Errorf("broker: %s: %w", op, err), ctx.Err())
	}
	return fmt.Errorf("%w: %s: %w", ErrCatalog, op, err)
}

// sooner is the capacity answer that frees up first: the earlier FreeAt
// (zero is none), and whether that is a held lease's end.
func sooner(a, b optimistic.CapacityError) optimistic.CapacityError {
	switch {
	case b.FreeAt.IsZero():
		return a
	case a.FreeAt.IsZero() || b.FreeAt.Before(a.FreeAt):
		return b
	case b.FreeAt.Equal(a.FreeAt):
		a.Held = a.Held || b.Held
	}
	return a
}
