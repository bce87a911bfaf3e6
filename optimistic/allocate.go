package optimistic

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	rs "github.com/credpool/credpool/internal/redisschema"
)

// Allocate leases a slot on the first candidate, in the given order, that is
// a member of req.Provider/req.Pool, is usable, and has fewer live leases
// than its limit. It returns a *CapacityError (ErrNoCapacity) when none has,
// ErrContended when conflicts outlast the retry budget, and an ErrStore on
// Redis failure.
//
// Each candidate is read under WATCH of its key HASH (one round trip:
// WATCH, TIME, the key HASH, the lease ZSET; unwatched first if this
// process just found it full) and, if it has room, claimed in one MULTI
// that prunes its expired leases, adds the lease and its record, and marks
// the key available. A conflict means another allocator just committed on
// that key: this process holds off the key for a few attempt-durations,
// trying the others meanwhile, then reads it again, since it may still
// have room; aborted twice, it is set aside and the next candidates are
// tried. Only when every candidate
// left was set aside does the call pause (jittered backoff) and go over
// them again, in order. On a hot key this keeps callers moving to keys with
// room instead of sleeping on the one they all want.
//
// Under concurrency the order is a preference: a candidate that another
// call of this process is working on, or that keeps aborting, is tried
// after the rest. Calls of this process waiting for a candidate's turn may
// be granted by the call holding it, in its own MULTI, when the key has
// room for them too (see ticket): one read and one EXEC for several grants.
// When it has none, the calls in line of callers that wait for a slot
// (WithWaiting) take that read as their own.
//
// On Redis Cluster, a candidate whose master does not answer or refuses
// the grant's write (see ErrUnreachable), or whose grant too few replicas
// acknowledged (Options.MinReplicas; the grant is
// given back), is skipped and counted in Stats.Unreachable; if no other
// candidate grants, the call fails with ErrStore and ErrUnreachable
// rather than ErrNoCapacity. (On other clients every key is on the one
// server, and the first failure ends the call.) A candidate whose EXEC
// reply was lost is rechecked before any other may grant (below), unless
// its master then does not answer at all: its outcome is given up, and
// the lease, if the EXEC landed, is nobody's and ends after the TTL.
//
// On error no lease is held. An EXEC whose outcome is unknown (its reply
// was lost, or ctx ended during it) and that no recheck settled before
// the call ended has its lease given back as the call ends; if that fails
// too (the store failing), the lease expires by itself after TTL.
//
// With req.Wait, a call that finds no free slot waits in line for one
// (see Await) and tries again when woken, until req.Wait passes; its
// Stats add up every try. A release in this process may hand it a slot
// meanwhile (see Release).
func (s *Store) Allocate(ctx context.Context, req AllocateRequest) (Lease, Stats, error) {
	if err := req.Validate(); err != nil {
		return Lease{}, Stats{}, err
	}
	if req.Wait > 0 {
		return AllocateWaiting(ctx, s, req, s.allocate)
	}
	return s.allocate(ctx, req)
}

// allocate is one Allocate call without waiting: req is valid.
func (s *Store) allocate(ctx context.Context, req AllocateRequest) (Lease, Stats, error) {
	var st Stats
	// One lease id per call: if an EXEC reply is lost, the next read finds
	// this id and returns the same lease instead of taking a second slot.
	a := allocation{Store: s, req: req, waits: IsWaiting(ctx), leaseID: uuid.NewString(), stats: &st, todo: distinct(req.Candidates)}
	a.member = rs.Member(a.leaseID, req.Provider, req.Pool)
	err := s.retry(ctx, func() error { return a.pass(ctx) })
	if err != nil {
		if a.pending != "" {
			// An EXEC of this call may have granted it a lease that
			// nobody will hold: given back, so that it takes no slot
			// until its TTL.
			a.giveBack(ctx, a.pending)
		}
		return Lease{}, st, Classify(ctx, "allocate", err)
	}
	return a.lease, st, nil
}

// allocation is the state one Allocate call keeps across passes.
type allocation struct {
	*Store
	req     AllocateRequest
	waits   bool // the caller waits in line for a slot (WithWaiting)
	leaseID string
	member  string // leaseID's member in a lease ZSET (redisschema.Member)
	stats   *Stats

	todo    []string      // candidates for the next pass, in order
	full    CapacityError // what the skipped candidates said, merged
	down    error         // why the first unreachable candidate was skipped
	pending string        // candidate on which an EXEC with leaseID may have committed
	lease   Lease
}

// pass tries a.todo in order. A candidate that another call of this
// process is working on right now (its gate is taken), or that this
// process holds off, is tried after all the others; the call waits for
// its turn only when every candidate left is busy so, and then for the
// one likely to come free first (see soonest). It returns nil with
// a.lease set, a *CapacityError when every candidate was full or
// unusable, or an ErrConflict or errRecheck to pause and try a.todo
// again: the candidates set aside after conflicts, or first the one whose
// EXEC reply was lost, so that it is rechecked before any other can
// grant.
func (a *allocation) pass(ctx context.Context) error {
	queue := make([]step, len(a.todo))
	for i, id := range a.todo {
		// A key whose EXEC reply was lost is waited for, never skipped:
		// no other key may grant before it is rechecked.
		queue[i] = step{keyID: id, wait: id == a.pending}
	}
	var aside []string
	// Candidates read one after the other share a connection (see session).
	var c conns
	defer c.end(ctx)
	// busy counts the candidates found busy one after the other: only
	// once every one left is, does the call wait, for the one likely to
	// come free first (see soonest).
	busy := 0
	for i := 0; i < len(queue); i++ {
		wait := queue[i].wait && (queue[i].keyID == a.pending || busy >= len(queue)-i)
		if wait && queue[i].keyID != a.pending {
			j := i + a.soonest(queue[i:])
			queue[i], queue[j] = queue[j], queue[i]
		}
		keyID := queue[i].keyID
		granted, err := a.try(ctx, &c, keyID, wait)
		if errors.Is(err, errGateBusy) {
			busy++
			queue = append(queue, step{keyID: keyID, wait: true, lost: queue[i].lost})
			continue
		}
		busy = 0
		if errors.Is(err, ErrConflict) && !queue[i].lost && a.pending != keyID {
			// Someone just committed on this key; it may still have room.
			// It is tried again after the others, once this process's
			// hold-off on it (see notes) has ended.
			queue = append(queue, step{keyID: keyID, wait: true, lost: true})
			continue
		}
		switch {
		case granted:
			return nil
		case a.pending == keyID && !errors.Is(err, errRecheck) && a.partial(ctx, err):
			// Its EXEC reply was lost, and now its master does not answer
			// the recheck (it died): the outcome cannot be settled. Given
			// up, and the others tried: if that EXEC did land, its lease
			// is held by nobody and ends by itself after the TTL.
			a.pending = ""
			a.stats.Unreachable++
			if a.down == nil {
				a.down = fmt.Errorf("candidate %s: %w", keyID, err)
			}
		case err != nil && a.pending == keyID:
			// Still unsettled (its EXEC reply was lost, or the recheck
			// itself was aborted): it goes first after the pause.
			a.todo = append([]string{keyID}, aside...)
			for _, st := range queue[i+1:] {
				a.todo = append(a.todo, st.keyID)
			}
			return err
		case errors.Is(err, ErrConflict):
			aside = append(aside, keyID)
		case a.partial(ctx, err), a.cluster && errors.Is(err, errUnreplicated):
			// Its server is down, or too few replicas acknowledged the
			// grant (given back); another candidate's server may do. Not
			// tried again by this call.
			a.stats.Unreachable++
			if a.down == nil {
				a.down = fmt.Errorf("candidate %s: %w", keyID, err)
			}
		case err != nil:
			return err
		}
	}
	if a.todo = aside; len(aside) > 0 {
		return fmt.Errorf("%w: every candidate left was contended", ErrConflict)
	}
	if a.down != nil {
		// The skipped ones may have room: the store failed, no pool is full.
		return fmt.Errorf("%w: %d of the candidates did not answer, take the write or replicate it, the others had no free slot: %w",
			ErrUnreachable, a.stats.Unreachable, a.down)
	}
	full := a.full
	return &full
}

// verdict is what one read-decide round on a candidate found. The WATCH
// callback only fills it in and try applies it once the transaction is
// over, so that the callback changes nothing but the transaction.
type verdict struct {
	settled bool  // read, and it holds no lease of this call
	granted bool  // a lease on it is ours: until and fence say which
	until   int64 // lease expiry (ms)
	fence   int64
	seq     int64     // the key's grant count after the commit
	pruned  int       // expired leases the commit removed
	room    int       // slots the key has free after the commit
	full    bool      // read with no slot for this call's provider and pool
	free    int64     // skipped: when it frees up (ms), 0 if never by itself
	held    bool      // free is when a held lease ends
	batch   []*ticket // waiting calls the commit granted too (see ticket)
}

// try reads one candidate (under WATCH, see decide), on c's connection,
// and claims a slot if it has one. Unless wait, it returns errGateBusy at
// once, having done nothing, if another call of this process holds the
// key's gate or this process holds the key off; if wait, it waits for
// both (c's connection given back first, as nothing may hold one while
// it waits), and returns errGateBusy, having done nothing, if a hold-off
// began while it waited for the gate.
func (a *allocation) try(ctx context.Context, c *conns, keyID string, wait bool) (granted bool, err error) {
	if wait {
		c.end(ctx)
	}
	// Held off outside the key's turn, so that this process's other
	// callers of the key may try other keys meanwhile.
	if err := a.holdOff(ctx, keyID, wait); err != nil {
		return false, err
	}
	var release func()
	if wait && a.pending == "" && !a.opts.NoGate {
		// In line for the turn, the holder may grant this call too.
		var done bool
		release, done, err = a.queueFor(ctx, keyID)
		if done {
			a.notes.won(keyID)
			return true, nil
		}
		if errors.Is(err, errSeenFull) {
			a.notes.skipped(keyID)
			return false, nil
		}
	} else {
		release, err = a.enter(ctx, keyID, wait)
	}
	if err != nil {
		return false, err
	}
	if !a.notes.until(keyID).IsZero() && a.pending != keyID {
		// A hold-off began while the turn was waited for: the pass
		// picks again, among the other candidates first.
		release()
		return false, errGateBusy
	}
	defer release()
	a.stats.Attempts++
	var v verdict
	start := time.Now()
	// The calls in line so far may take this read as theirs (see deny).
	posted := a.lines.mark()
	// Only the key HASH is watched at first (see decide).
	err = a.watchOn(ctx, c, []string{a.keys.Key(keyID)}, func(t *txn) (err error) {
		v, err = a.decide(ctx, t, keyID)
		return err
	})
	if errors.Is(err, ErrConflict) {
		a.stats.Conflicts++
	}
	if errors.Is(err, redis.TxFailedErr) && !a.opts.NoGate {
		a.notes.hold(keyID, time.Since(start), a.opts.MaxBackoff)
	}
	if v.settled && a.pending == keyID {
		a.pending = ""
	}
	if errors.Is(err, errRecheck) {
		a.pending = keyID
	}
	a.full.Merge(fromMillis(v.free), v.held)
	if v.full && err == nil && !a.opts.NoGate {
		a.lines.deny(keyID, a.req.Provider, a.req.Pool, posted, v.free, v.held)
	}
	if errors.Is(err, errUnreplicated) {
		// Nobody may hold these leases. The tickets' calls go back in
		// line, and find the give-back done when the turn is theirs.
		settleTickets(v.batch, false, false)
		members := []string{a.member}
		for _, tk := range v.batch {
			members = append(members, tk.member)
		}
		a.giveBackMembers(ctx, keyID, members...)
		if a.pending == keyID {
			// The lease a lost reply left is given back: settled.
			a.pending = ""
		}
		return false, err
	}
	settleTickets(v.batch, v.granted, errors.Is(err, errRecheck))
	if v.granted {
		a.fences.saw(keyID, v.fence+int64(len(v.batch)))
		a.seqs.saw(keyID, v.seq)
	}
	if v.granted && len(v.batch) > 0 && ctx.Err() != nil {
		// Committed for the others after this call's ctx ended (see
		// settle): its own lease goes back, as a ticket's would.
		a.giveBack(ctx, keyID)
		return false, ctx.Err()
	}
	if v.granted {
		a.grant(keyID, v.until, v.fence)
		a.stats.Pruned += v.pruned
		a.notes.won(keyID)
		// Expired leases pruned here freed slots nobody was told of:
		// callers waiting in line behind the one whose FreeAt brought
		// it here would otherwise find them one poll at a time. The
		// caller granted, if in line itself, is passed over.
		for range min(v.pruned, v.room) {
			a.queue.WakeOthers(ctx, keyID)
		}
	}
	if v.settled && !v.granted && err == nil {
		a.notes.skipped(keyID)
	}
	return v.granted, err
}

// step is one candidate to try in a pass.
type step struct {
	keyID string
	wait  bool // for the gate; else skip the key while it is taken
	lost  bool // lost a race in this pass already
}

// soonest returns the index of the step, of steps that all wait for a
// busy key, whose key is likely to come free first: the first that only
// waits for its turn (another call of this process is trying it: a round
// trip or two), else the one whose hold-off ends first.
func (a *allocation) soonest(steps []step) int {
	best, bestUntil := 0, time.Time{}
	for i, s := range steps {
		until := a.notes.until(s.keyID)
		if until.IsZero() {
			return i
		}
		if bestUntil.IsZero() || until.Before(bestUntil) {
			best, bestUntil = i, until
		}
	}
	return best
}

// holdOff keeps the call off keyID while this process is held off it
// after losing a race there (see notes): unless wait, it returns
// errGateBusy, for the other candidates to go first; else it waits for
// the hold-off to end, holding no connection and not the key's turn. A key whose EXEC reply was lost is never
// held off: no other key may grant before it is rechecked. Without the
// gate (Options.NoGate) nothing is held off: each call races on its own.
func (a *allocation) holdOff(ctx context.Context, keyID string, wait bool) error {
	until := a.notes.until(keyID)
	switch {
	case until.IsZero(), a.pending == keyID:
		return nil
	case !wait:
		return errGateBusy
	}
	return sleepUntil(ctx, until)
}

// decide is one round on keyID inside a transaction that watches the key
// HASH: read, decide, commit. It changes nothing but the transaction and
// its verdict.
//
// Every grant writes the HASH, and so does a sync or a delete: watching
// it, EXEC aborts on any write that could make the grant one too many. A
// release, a renewal or a clear-out only shortens the lease ZSET or moves
// a live lease's expiry, which leaves a grant decided before it within
// the limit: those no longer abort a grant on a busy key. The one
// exception is a lease counted out as expired, which a renewal that read
// it just before it expired may extend: a grant that would prune expired
// leases first watches the ZSET too and reads again.
func (a *allocation) decide(ctx context.Context, t *txn, keyID string) (verdict, error) {
	keyKey, leasesKey := a.keys.Key(keyID), a.keys.Leases(keyID)
	recordKey := a.keys.Lease(keyID, a.member)
	// After a lost EXEC reply on this key, the read also takes the fence
	// that EXEC would have written, should it have landed.
	recheck := a.pending == keyID
	// A key this process just skipped (full, say) is read without WATCH
	// first (a peek): while it stays full, that read is all it costs.
	t.peek = t.arm != nil && !recheck && a.notes.skippedLately(keyID)
	for wide := false; ; {
		var (
			v      verdict
			clock  *redis.TimeCmd
			hash   *redis.SliceCmd
			leases *redis.ZSliceCmd
			record *redis.SliceCmd
		)
		seen := a.seqs.last(keyID)
		err := t.read(ctx, func(p redis.Pipeliner) {
			clock = p.Time(ctx)
			hash = p.HMGet(ctx, keyKey, keyFields...)
			leases = p.ZRangeWithScores(ctx, leasesKey, 0, -1)
			if recheck {
				record = p.HMGet(ctx, recordKey, rs.FieldFence)
			}
		})
		if err != nil {
			return v, err
		}
		clockNow := clock.Val()
		now := clockNow.UnixMilli()
		if recheck {
			if until, ok := liveScore(leases.Val(), a.member, now); ok {
				v, err := a.adopt(ctx, t, recordKey, until, record.Val())
				// Read after the lost EXEC, the count has its grant.
				v.seq = parseKey(hash.Val()).seq
				return v, err
			}
		}
		v.settled = true
		k := parseKey(hash.Val())
		if k.behind(seen) {
			if t.peek {
				t.peek = false
				continue
			}
			until, err := a.hold(ctx, t, keyID, k, seen, now)
			if err == nil {
				v.full, v.free = true, until
			}
			return v, err
		}
		a.sawRead(keyID, k)
		ls := splitLeases(leases.Val(), now)
		if !k.member(a.req.Provider, a.req.Pool) {
			return v, nil
		}
		if !k.usable(now) || ls.live >= k.limit {
			v.full = true
			v.free, v.held = freeAt(k, ls, now)
			return v, nil
		}
		switch {
		case t.peek:
			// Room, seen unwatched: read it again under WATCH.
			t.peek = false
		case len(ls.expired) == 0 || wide:
			return a.take(ctx, t, v, keyID, k, ls, clockNow)
		default:
			if err := t.widen(ctx, leasesKey); err != nil {
				return v, err
			}
			wide = true
		}
	}
}

// take commits a grant on keyID, which has a free slot by k and ls read
// at clockNow, pruning ls's expired leases.
func (a *allocation) take(ctx context.Context, t *txn, v verdict, keyID string, k keyState, ls leaseSet, clockNow time.Time) (verdict, error) {
	keyKey, leasesKey := a.keys.Key(keyID), a.keys.Leases(keyID)
	now := clockNow.UnixMilli()
	until := now + a.req.TTL.Milliseconds()
	fence := NextFence(k.fence, clockNow)
	var body []cmd
	if len(ls.expired) > 0 {
		prune := cmd{"zrem", leasesKey}
		records := cmd{"del"}
		for _, id := range ls.expired {
			prune, records = append(prune, id), append(records, a.keys.Lease(keyID, id))
		}
		body = append(body, prune, records)
	}
	body = append(body, a.leaseWrites(keyID, a.member, a.req.Provider, a.req.Pool, until, fence)...)
	last := fence
	if room := k.limit - ls.live - 1; room > 0 && !a.opts.NoGate {
		// Calls of this process waiting for the key's turn share the
		// commit (see ticket).
		v.batch = a.lines.claim(keyID, min(room, maxBatch), k.member)
		for _, tk := range v.batch {
			last++
			tk.until, tk.fence = now+tk.ttlMillis, last
			body = append(body, a.leaseWrites(keyID, tk.member, tk.provider, tk.pool, tk.until, tk.fence)...)
		}
	}
	v.room = k.limit - ls.live - 1 - len(v.batch)
	// The HASH is watched, and every write of its count writes the HASH:
	// the count read is the count at EXEC.
	v.seq = nextSeq(k.seq, int64(1+len(v.batch)), clockNow)
	body = append(body, cmd{"hset", keyKey,
		rs.FieldStatus, string(StatusAvailable), rs.FieldCooldown, "",
		rs.FieldLastUsed, now, rs.FieldFence, last, rs.FieldSeq, v.seq})
	v.pruned = len(ls.expired)
	return a.settle(ctx, t, v, body, until, fence)
}

// leaseWrites are the writes of one lease on keyID: its member in the
// lease ZSET and its record.
func (a *allocation) leaseWrites(keyID, member, provider, pool string, until, fence int64) []cmd {
	recordKey := a.keys.Lease(keyID, member)
	return []cmd{
		{"zadd", a.keys.Leases(keyID), until, member},
		{"hset", recordKey,
			rs.FieldKeyID, keyID, rs.FieldProvider, provider, rs.FieldPool, pool,
			rs.FieldUntil, until, rs.FieldFence, fence},
		{"pexpireat", recordKey, until + a.opts.RecordGrace.Milliseconds()},
	}
}

// adopt hands out the lease (until, its fence in record) that an EXEC
// of this call wrote though its reply was lost. With Options.MinReplicas
// it is acknowledged like a fresh grant: it commits a rewrite of the
// record's expiry, unchanged, and WAIT rides along. The master's
// replication offset only grows, so replicas that acknowledge the rewrite
// have the lost EXEC too.
func (a *allocation) adopt(ctx context.Context, t *txn, recordKey string, until int64, record []any) (verdict, error) {
	raw, _ := record[0].(string)
	fence, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return verdict{}, fmt.Errorf("optimistic: lease %s has no valid fence in its record", a.leaseID)
	}
	var body []cmd
	if a.opts.MinReplicas > 0 {
		body = []cmd{{"hset", recordKey, rs.FieldUntil, until}}
	}
	return a.settle(ctx, t, verdict{}, body, until, fence)
}

// settle commits body, the writes of a grant of until and fence, and says
// what came of it: granted (with no body, at once); errUnreplicated, for
// try to give the slot back; errRecheck when the reply was lost and the
// writes may have landed; or the commit's own error.
func (a *allocation) settle(ctx context.Context, t *txn, v verdict, body []cmd, until, fence int64) (verdict, error) {
	if len(body) > 0 {
		cctx := ctx
		if len(v.batch) > 0 {
			// Other calls' grants ride along: this call's ctx does not
			// cut their commit short.
			var cancel context.CancelFunc
			cctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), coalesceTimeout)
			defer cancel()
		}
		err := t.commit(cctx, body)
		var rerr redis.Error
		switch {
		case err == nil:
		case errors.Is(err, errUnreplicated), errors.As(err, &rerr):
			// Unacknowledged, or refused or aborted: the call learns why.
			return v, err
		default:
			// Sent or not, ran or not: the next read tells, or, if the
			// call ends first (its ctx ended during the commit), the
			// lease is given back (see allocate).
			return v, fmt.Errorf("%w: %w", errRecheck, err)
		}
	}
	v.granted, v.until, v.fence = true, until, fence
	return v, nil
}

// giveBack deletes this call's lease on keyID, which too few replicas
// acknowledged: a failover could lose it and grant the slot again, so
// nobody may hold it. It is one MULTI to the key's owner, sent even after
// ctx ended; if it fails, the store is failing too, and the lease expires
// by itself.
func (a *allocation) giveBack(ctx context.Context, keyID string) {
	a.giveBackMembers(ctx, keyID, a.member)
}

// giveBackMembers deletes the leases of members on keyID in one MULTI, as
// giveBack does.
func (s *Store) giveBackMembers(ctx context.Context, keyID string, members ...string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unwatchTimeout)
	defer cancel()
	leasesKey := s.keys.Leases(keyID)
	zrem := []any{"zrem", leasesKey}
	del := []any{"del"}
	for _, m := range members {
		zrem, del = append(zrem, m), append(del, s.keys.Lease(keyID, m))
	}
	drop := func(c redis.UniversalClient) error {
		_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Do(ctx, zrem...)
			p.Do(ctx, del...)
			return nil
		})
		return err
	}
	rdb, err := s.owner(ctx, leasesKey)
	if err != nil {
		return
	}
	if err := drop(rdb); isRedirect(err) {
		// The slot moved: let the cluster client follow it.
		_ = drop(s.rdb)
	}
}

func (a *allocation) grant(keyID string, until, fence int64) {
	a.lease = Lease{
		LeaseRef: LeaseRef{Provider: a.req.Provider, Pool: a.req.Pool, KeyID: keyID, LeaseID: a.leaseID},
		Until:    fromMillis(until),
		Fence:    fence,
	}
}

// distinct returns ids without repeats, in first-seen order.
func distinct(ids []string) []string {
	seen := make(map[string]bool, len(ids))
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}
