package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/optimistic"
)

// releaseTimeout bounds clean-up after the request's own context ended
// (giving a slot back, aligning the store): a slot left behind would stay
// taken until its lease expires, a key left grantable would be granted.
const releaseTimeout = 5 * time.Second

// detach is ctx without its cancellation, bounded by releaseTimeout: for
// clean-up that must happen even if the caller has gone.
func detach(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
}

// poolRun is one allocate request's pass over one pool.
type poolRun struct {
	*Broker
	req   Request
	pool  string
	model string
	grant *Grant
	// wait is the soonest a key that serves the model but is held back (a
	// cooldown, a quarantine, found at any step) frees up by itself.
	wait optimistic.CapacityError
	// gone says the re-check found a granted key deleted, moved out of the
	// pool, or no longer serving the model (see confirm).
	gone bool
	// unopened is why the re-check gave back a grant of a key whose secret
	// does not open here, the first time: with it, "full" is this
	// instance's failure.
	unopened error
	// unread is why the re-check gave back a grant of a key it could not
	// tell was this store's (the store's id did not answer), the first
	// time: with it, "full" is the store's failure.
	unread error
}

// heldBack notes a key held back until at (zero: not by itself).
func (p *poolRun) heldBack(at time.Time) {
	p.wait = sooner(p.wait, optimistic.CapacityError{FreeAt: at})
}

// candidates returns the pool's keys that serve the model and may take a
// lease now, and whether any key serves the model at all; those held back
// count in p.wait. Passed cooldowns and quarantines are cleared in the
// catalog on the way.
func (p *poolRun) candidates(ctx context.Context, keys []catalog.Key) (cands []catalog.Key, served bool) {
	now := time.Now()
	for _, k := range keys {
		if !k.Supports(p.model) {
			continue
		}
		served = true
		if !k.Usable(now) {
			p.heldBack(k.UsableAt())
			continue
		}
		if k.Status != optimistic.StatusAvailable || !k.QuarantineUntil.IsZero() {
			k = p.recover(ctx, k, now)
		}
		cands = append(cands, k)
	}
	return cands, served
}

// recover marks a key whose cooldown has passed available again in the
// catalog. The store needs no sync: it grants such a key anyway and marks
// it available when it does. (A sync here could also recreate, unnoticed,
// a key the store lost; repair is what tells that apart.) It is best
// effort: a failure only costs a log line.
func (p *poolRun) recover(ctx context.Context, k catalog.Key, now time.Time) catalog.Key {
	changed, err := p.catalog.RecoverCooldown(ctx, k.ID, now)
	if err != nil {
		p.log.WarnContext(ctx, "recover cooldown in catalog", "key_id", k.ID, "err", err)
		return k
	}
	if !changed {
		return k
	}
	if k.Status == optimistic.StatusRateLimited || k.Status == optimistic.StatusCooldown {
		k.Status, k.CooldownUntil = optimistic.StatusAvailable, time.Time{}
	}
	k.QuarantineUntil = time.Time{}
	return k
}

// allocate ranks cands by live capacity and health and leases the first
// with a slot. An empty first answer repairs the store where its view of a
// candidate differs from the catalog's (it may have missed a change),
// flushes releases of the candidates that wait for the store, and asks
// once more if either freed something. A grant the catalog no longer backs
// is given back and the rest tried. A full answer leaves out p.wait: the
// caller adds it.
func (p *poolRun) allocate(ctx context.Context, cands []catalog.Key) error {
	order, infos, err := p.rank(ctx, cands)
	if err != nil {
		return err
	}
	retried := false
	// skipped is why keys that may have room were passed over: repair
	// could not reach their server, or the re-check could not open their
	// secret. With it, "full" is a failure, not a full pool.
	var skipped error
	for len(order) > 0 {
		settled := p.backlog.settled()
		lease, st, err := p.store.Allocate(ctx, optimistic.AllocateRequest{
			Provider: p.req.Provider, Pool: p.pool, Candidates: order, TTL: p.req.TTL,
		})
		p.grant.Stats.Add(st)
		full := errors.Is(err, optimistic.ErrNoCapacity) || errors.Is(err, optimistic.ErrUnreachable)
		switch {
		case err == nil:
			// The store passed over the keys before the one granted.
			if i := slices.Index(order, lease.KeyID); i > 0 {
				p.live.busier(order[:i]...)
			}
			p.live.granted(lease.KeyID, time.Now())
		case full:
			p.live.drop(order...)
		}
		// Full, or full but for keys on a server that is down: repair what
		// answers.
		if full && !retried {
			retried = true
			n, unfixed, rerr := p.repair(ctx, cands, infos)
			if rerr != nil {
				return rerr
			}
			if unfixed != nil {
				skipped = unfixed
			}
			// Full perhaps only because releases waited for the store: if
			// it took some since it was asked, in this round or the
			// background's, ask again.
			if p.backlog.stuck(ids(cands)...) > 0 {
				p.backlog.round(ctx, ids(cands)...)
			}
			if n > 0 || p.backlog.settled() > settled {
				continue
			}
		}
		if err != nil {
			if skipped != nil && errors.Is(err, optimistic.ErrNoCapacity) {
				return skipped
			}
			return err
		}
		ok, err := p.confirm(ctx, lease)
		if ok || err != nil {
			return err
		}
		if skipped == nil {
			skipped = cmp.Or(p.unopened, p.unread)
		}
		order = slices.DeleteFunc(order, func(id string) bool { return id == lease.KeyID })
	}
	if skipped != nil {
		return skipped
	}
	return &optimistic.CapacityError{}
}

// rank orders cands best first. The catalog ranks them all (health, idle
// time, jitter; every slot counted free); the store's live state (free
// slots, last grant) is read, in one round trip, for the best p.inspect of
// them only, so an allocate costs the same however large the pool. Those
// ranked again with it go first if they have a free slot, and last if not,
// after them those whose server did not answer (a Redis Cluster master
// that is down): the store then takes the first key in that order with a
// free slot, skipping those it cannot reach. The live state is known for
// the most part (see live); it returns, by key id, the states it read from
// the store.
func (p *poolRun) rank(ctx context.Context, cands []catalog.Key) ([]string, map[string]optimistic.KeyInfo, error) {
	now := time.Now()
	byID := make(map[string]catalog.Key, len(cands))
	rc := make([]Candidate, len(cands))
	for i, k := range cands {
		byID[k.ID] = k
		rc[i] = candidate(k, optimistic.KeyInfo{})
	}
	p.mu.Lock()
	order := p.weights.Rank(rc, now, p.rng)
	p.mu.Unlock()
	// The best p.inspect that answer: a key whose server is down (a Redis
	// Cluster master) comes back unread, and the next in order is read in
	// its place, so a dead master's keys, which rank ever higher as they
	// go unused, cannot hide the rest.
	var infos []optimistic.KeyInfo
	read := map[string]optimistic.KeyInfo{}
	next := 0
	for known := 0; known < p.inspect && next < len(order); {
		n := min(p.inspect-known, len(order)-next)
		got, err := p.liveState(ctx, order[next:next+n], read)
		if err != nil {
			return nil, nil, err
		}
		next += n
		for _, in := range got {
			if !in.Unreachable {
				known++
			}
		}
		infos = append(infos, got...)
	}
	top := order[:next]
	live := make(map[string]optimistic.KeyInfo, len(infos))
	rc = rc[:0]
	for _, in := range infos {
		live[in.ID] = in
		rc = append(rc, candidate(byID[in.ID], in))
		// A key the catalog names another store's is confirm's to hold.
		if _, lost := p.lostUntil(byID[in.ID], in, false, now); lost && in.Exists {
			p.mirror(ctx, byID[in.ID], in)
		}
	}
	p.mu.Lock()
	ranked := p.weights.Rank(rc, now, p.rng)
	p.mu.Unlock()
	var free, full, down []string
	for _, id := range ranked {
		switch in := live[id]; {
		case in.Unreachable:
			down = append(down, id)
		case in.Exists && in.Live >= in.Limit:
			full = append(full, id)
		default:
			free = append(free, id)
		}
	}
	out := append(free, order[len(top):]...)
	return p.unopenedLast(append(append(out, full...), down...), now), read, nil
}

// unopenedFor is how long a key whose secret did not open here is ranked
// last: tried only when no other key has room, and warned of once.
const unopenedFor = time.Minute

// unopenedLast moves the keys whose secret did not open here within
// unopenedFor to the end of order.
func (p *poolRun) unopenedLast(order []string, now time.Time) []string {
	var last []string
	out := order[:0]
	for _, id := range order {
		if until, ok := p.unopenedKeys.Load(id); ok && now.Before(until.(time.Time)) {
			last = append(last, id)
		} else {
			out = append(out, id)
		}
	}
	return append(out, last...)
}

// mirror quarantines k in the catalog, which the store holds back, by in,
// having found its state older than a grant it had seen (see
// syncer.lostUntil): so every instance agrees, and the loss is counted and
// reported. Of the allocates of this process that read the hold before the
// quarantine reached their catalog snapshot, one does it. It is best
// effort: the store refuses the key meanwhile anyway, so a failure costs
// a log line, and the next rank tries again.
func (p *poolRun) mirror(ctx context.Context, k catalog.Key, in optimistic.KeyInfo) {
	until := in.HeldUntil.UnixMilli()
	if !p.losses.claim(k.ID, until) {
		return
	}
	if _, _, err := p.sync(ctx, k, in); err != nil && !errors.Is(err, catalog.ErrNotFound) {
		p.losses.unclaim(k.ID, until)
		p.log.WarnContext(ctx, "quarantine a key the lease store holds back", "key_id", k.ID, "err", err)
	}
}

// liveState returns the live state of ids: as known (see live), or read
// from the store now, in one round trip, for those it does not know;
// those are added to read too. A key whose server did not answer comes
// back Unreachable.
func (p *poolRun) liveState(ctx context.Context, ids []string, read map[string]optimistic.KeyInfo) ([]optimistic.KeyInfo, error) {
	got, missing := p.live.get(ids)
	if len(missing) == 0 {
		return got, nil
	}
	want := make([]string, len(missing))
	for j, i := range missing {
		want[j] = ids[i]
	}
	start := time.Now()
	fresh, err := p.store.Inspect(ctx, want...)
	switch {
	case errors.Is(err, optimistic.ErrUnreachable):
		// None of these answered; the next may.
		fresh = make([]optimistic.KeyInfo, len(want))
		for j, id := range want {
			fresh[j] = optimistic.KeyInfo{ID: id, Unreachable: true}
		}
	case err != nil:
		return nil, err
	case len(fresh) != len(want):
		return nil, fmt.Errorf("%w: inspect: %d states for %d keys", optimistic.ErrStore, len(fresh), len(want))
	default:
		p.live.readNow(fresh, start)
	}
	for j, i := range missing {
		got[i] = fresh[j]
		read[fresh[j].ID] = fresh[j]
	}
	return got, nil
}

// candidate is what ranking knows of k, with its live state in if read
// (in.Exists); a key the store has not read or does not hold yet is ranked
// by the catalog's limit, every slot free.
func candidate(k catalog.Key, in optimistic.KeyInfo) Candidate {
	c := Candidate{
		ID: k.ID, Status: k.Status, LastUsedAt: later(k.LastUsedAt, in.LastUsedAt), LastVerifiedAt: k.LastVerifiedAt,
		Successes: k.Successes, Errors: k.Errors, RateLimitHits: k.RateLimitHits,
		Free: max(k.MaxConcurrentUses, 1), Limit: max(k.MaxConcurrentUses, 1),
	}
	if in.Exists {
		c.Free, c.Limit = max(in.Limit-in.Live, 0), in.Limit
	}
	return c
}

// later is the later of two times: the catalog's last use of a key is
// written behind, the store's is its last grant.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// repair syncs into the store every candidate whose store state differs
// from the catalog's, and returns how many it synced and may now grant
// (none means the pool is really full), and why it passed over any whose
// server did not answer or take the write (then the pool may not be).
// ranked is rank's read of the store: it serves if it covers every
// candidate and says none could grant; otherwise (the store has just
// denied a grant it promised, so changed since) the store is read again.
// Each key that differs is read again from the catalog (the request's
// snapshot may be older than an admin's latest sync) and then from the
// store, in that order, as syncer.sync needs; one the store lost is
// quarantined instead.
func (p *poolRun) repair(ctx context.Context, cands []catalog.Key, ranked map[string]optimistic.KeyInfo) (int, error, error) {
	infos := make([]optimistic.KeyInfo, len(cands))
	for i, k := range cands {
		infos[i] = ranked[k.ID]
	}
	if len(ranked) < len(cands) || grantable(infos, time.Now()) {
		var err error
		if infos, err = p.store.Inspect(ctx, ids(cands)...); err != nil {
			return 0, nil, err
		}
	}
	var stale []catalog.Key
	for i, k := range cands {
		// A key the store could not read is neither stale nor lost.
		if infos[i].Unreachable || !differs(infos[i], k.LeaseState()) {
			continue
		}
		fresh, err := p.catalog.Key(ctx, k.ID)
		if errors.Is(err, catalog.ErrNotFound) {
			continue
		}
		if err != nil {
			return 0, nil, catalogErr(ctx, "repair", err)
		}
		stale = append(stale, fresh)
	}
	if len(stale) == 0 {
		return 0, nil, nil
	}
	infos, err := p.store.Inspect(ctx, ids(stale)...)
	if err != nil {
		return 0, nil, err
	}
	n := 0
	var skipped error
	for i, k := range stale {
		synced, lost, err := p.sync(ctx, k, infos[i])
		switch {
		case errors.Is(err, catalog.ErrNotFound):
			continue
		case errors.Is(err, optimistic.ErrUnreachable):
			// Its master does not answer or take writes now: the
			// others may still grant.
			skipped = cmp.Or(skipped, err)
			continue
		case err != nil:
			return n, skipped, err
		}
		if lost {
			// Held back: frees up by itself once its quarantine ends.
			p.heldBack(synced.QuarantineUntil)
			continue
		}
		n++
	}
	if n > 0 {
		p.log.InfoContext(ctx, "lease store repaired from the catalog", "provider", p.req.Provider, "pool", p.pool, "keys", n)
	}
	return n, skipped, nil
}

// grantable reports whether, by infos, some key could grant at now. FreeAt
// is the store's clock and now this host's: skew only decides whether
// repair reads the store again.
func grantable(infos []optimistic.KeyInfo, now time.Time) bool {
	for _, in := range infos {
		if in.Exists && !in.FreeAt.IsZero() && !in.FreeAt.After(now) {
			return true
		}
	}
	return false
}

// differs reports whether the store's state of a key differs from the
// catalog's in anything Allocate reads.
func differs(in optimistic.KeyInfo, want optimistic.KeyState) bool {
	return !in.Exists || in.Provider != want.Provider || in.Pool != want.Pool ||
		in.Status != want.Status || in.Limit != max(want.MaxConcurrentUses, 1) ||
		in.CooldownUntil.UnixMilli() != want.CooldownUntil.UnixMilli()
}

// confirm re-reads the granted key in the catalog (catalog.Cache reads
// the generation, and the row only if it moved). If it still exists,
// belongs to this provider and pool, is usable and serves the model, and
// the model's alias did not move, it notes last_used_at and fills the
// grant. Otherwise it gives the slot back, brings the store in line with
// the catalog (but for a moved alias: errAliasMoved, and a secret that
// does not open here: p.unopened), and reports false.
func (p *poolRun) confirm(ctx context.Context, lease optimistic.Lease) (bool, error) {
	now := time.Now()
	k, err := p.catalog.Get(ctx, lease.KeyID)
	reason := ""
	switch {
	case errors.Is(err, catalog.ErrNotFound):
		reason, p.gone = "deleted", true
	case errors.Is(err, catalog.ErrSecret):
		// The others may open: the pool is not down for one key sealed
		// with a sealing key this instance lacks. It is ranked last for a
		// while, and warned of once then.
		if until, ok := p.unopenedKeys.Swap(lease.KeyID, now.Add(unopenedFor)); !ok || !now.Before(until.(time.Time)) {
			p.log.WarnContext(ctx, "secret does not open here: key passed over, ranked last for a while", "key_id", lease.KeyID, "err", err)
		}
		p.giveBack(ctx, lease, "secret does not open")
		if p.unopened == nil {
			p.unopened = catalogErr(ctx, "open the key's secret", err)
		}
		return false, nil
	case err != nil:
		p.giveBack(ctx, lease, "catalog read failed")
		return false, catalogErr(ctx, "re-check key", err)
	case k.Provider != lease.Provider || k.Pool != lease.Pool:
		reason, p.gone = "moved to another provider or pool", true
	case !k.Usable(now):
		reason = "status " + string(k.Status)
		if k.QuarantineUntil.After(now) {
			reason = "quarantined"
		}
		p.heldBack(k.UsableAt())
	case !k.Supports(p.model):
		reason, p.gone = "no longer serves the model", true
	}
	if reason != "" {
		p.giveBack(ctx, lease, reason)
		p.align(ctx, lease.KeyID, k, err == nil)
		return false, nil
	}
	switch moved, err := p.moved(ctx, k, optimistic.KeyInfo{ID: k.ID, Exists: true}); {
	case err != nil:
		// The key is marked with a name this process does not know, and
		// the store's id, which may have become that name, did not answer.
		p.giveBack(ctx, lease, "lease store id unread")
		if p.unread == nil {
			p.unread = err
		}
		return false, nil
	case moved:
		// Another lease store synced the key since this one did: this
		// store's view of it knows nothing of that store's grants.
		p.giveBack(ctx, lease, "synced to another lease store since")
		p.holdMoved(ctx, k)
		return false, nil
	}
	// A request that resolved its model from a recent snapshot checks the
	// alias on the snapshot Get made current (no read of its own, unless
	// this process wrote since; if that read fails the grant stands: the
	// key is confirmed).
	if p.req.recent() {
		if canonical, _, err := p.catalog.ResolveRecent(ctx, p.req.Provider, p.req.Model); err == nil && canonical != p.model {
			p.giveBack(ctx, lease, "model alias changed")
			return false, errAliasMoved
		}
	}
	p.catalog.MarkUsed(k.ID, now)
	p.grant.Lease, p.grant.Secret = lease, k.Secret
	return true, nil
}

// giveBack releases a lease the request will not use, even if the
// request's context has ended.
func (p *poolRun) giveBack(ctx context.Context, lease optimistic.Lease, reason string) {
	ctx, cancel := detach(ctx)
	defer cancel()
	err := p.Release(ctx, lease.LeaseRef)
	p.log.InfoContext(ctx, "grant given back", "key_id", lease.KeyID, "lease_id", lease.LeaseID, "reason", reason, "release_err", err)
}

// holdMoved resyncs k, which the catalog says another lease store synced
// last, even if the request's context has ended: k is held back.
func (p *poolRun) holdMoved(ctx context.Context, k catalog.Key) {
	ctx, cancel := detach(ctx)
	defer cancel()
	synced, err := p.resync(ctx, k)
	if err != nil {
		p.log.WarnContext(ctx, "hold back a key another lease store served", "key_id", k.ID, "err", err)
		return
	}
	if synced.QuarantineUntil.After(time.Now()) {
		p.heldBack(synced.QuarantineUntil)
	}
}

// align makes the store follow the catalog for a key it should not have
// granted, even if the request's context has ended: gone from the catalog
// means gone from the store.
func (p *poolRun) align(ctx context.Context, id string, k catalog.Key, found bool) {
	ctx, cancel := detach(ctx)
	defer cancel()
	var err error
	if found {
		_, err = p.resync(ctx, k)
	} else {
		err = p.store.DeleteKey(ctx, id)
	}
	if err != nil {
		p.log.WarnContext(ctx, "align store with catalog", "key_id", id, "err", err)
	}
}
