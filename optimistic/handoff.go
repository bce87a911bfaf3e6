package optimistic

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	rs "github.com/credpool/credpool/internal/redisschema"
)

// A release on a key that callers of this process wait for (Allocate with
// Wait) hands its slot to the first of them in its own MULTI, instead of
// freeing it for that caller to take with a read and an EXEC of its own:
// the MULTI removes the released lease and adds the caller's, and the
// slot is never free in between. One round trip then does what took four
// (the release, and the caller's WATCH and read, and its EXEC), and the
// key's turn (see enter) is not taken at all.
//
// Nothing is read before the MULTI: the transfer is checked by what the
// MULTI itself reads after its writes, and the caller gets the lease only
// if the key still exists, serves the lease's provider and pool, is
// usable, and holds no more leases than its limit, expired ones counted;
// else the caller's lease is deleted at once and the caller tries the
// store as if woken. Until then the lease is nobody's, so no holder is
// ever over the limit; a transfer only replaces a lease, so it is one too
// many only when the released lease was gone already. The MULTI writes
// the key HASH (its fence, by HINCRBY: one above the key's last, so never
// handed out twice, and, at one per grant, never past the clock part of
// NextFence), which aborts every grant another allocator decided before.
//
// The fence must be fresh by the clock, as NextFence would take it: a
// transfer is refused unless the key's last fence is under fenceFresh
// old by the store's clock. A HASH made again without a fence (a key
// deleted and synced, a store that lost it) so hands out nothing below
// the tokens it gave before, and a fence that a failover lost with its
// handoff is not handed out again once fenceFresh has passed. Since a
// handoff only adds one to the fence, a release hands off only while
// the last fence this process saw on the key is fresh too (see fences);
// else it frees the slot, and the woken caller's grant sets the fence by
// the clock again. On a key whose slots are held for longer than that,
// releases simply free their slots: a handoff saves a fraction of a
// millisecond, which only short holds notice.
//
// The handed lease's record has no fence: only the recheck of a lost
// EXEC reads one, and a handed lease is never rechecked (a lost reply of
// a handoff deletes it).
//
// A handoff keeps a slot in this process, so a release hands off only
// when the slot is this process's turn (Store.turn): while no other
// process listens for the key's free-slot notices (as last heard from a
// release: its SPUBLISH, or the PUBSUB SHARDNUMSUB that follows a
// handoff), or while the other listeners are stores heard waiting and
// none of their callers waited turnSlack longer than this one's. Callers
// that do not wait, here or anywhere, find the key full while callers
// wait for it: waiting callers go first. No handoff is made with
// Options.MinReplicas (the transfer would need the acknowledgement a
// grant has), with NoGate, or through a client that routes commands
// itself.

// storeClock keeps, per server, its clock (TIME) as a release last read
// it, and when, by this host's monotonic clock: a handoff computes its
// lease's expiry from it, whatever this host's wall clock does.
type storeClock struct{ m sync.Map } // *redis.Client → storeTime

type storeTime struct {
	ms int64 // the server's TIME
	at time.Time
}

func (c *storeClock) set(node *redis.Client, storeNow int64) {
	c.m.Store(node, storeTime{ms: storeNow, at: time.Now()})
}

// now returns node's clock (ms), if it was read.
func (c *storeClock) now(node *redis.Client) (int64, bool) {
	v, ok := c.m.Load(node)
	if !ok {
		return 0, false
	}
	t := v.(storeTime)
	return t.ms + time.Since(t.at).Milliseconds(), true
}

// fenceFresh is how old, by the store's clock, a key's last fence may be
// for a handoff to take the next one (see above): Store.fenceFresh.
const fenceFresh = time.Second

// fences keeps the highest value of a kind this process saw on each key:
// the fences it granted (Store.fences, for handoffs), or the grant counts
// it granted or read (Store.seqs, see lost.go). It is safe for concurrent
// use.
type fences struct{ m sync.Map } // key id → *atomic.Int64

// saw records n, unless a higher value was seen.
func (f *fences) saw(keyID string, n int64) {
	v, ok := f.m.Load(keyID)
	if !ok {
		v, _ = f.m.LoadOrStore(keyID, new(atomic.Int64))
	}
	seen := v.(*atomic.Int64)
	for {
		old := seen.Load()
		if old >= n || seen.CompareAndSwap(old, n) {
			return
		}
	}
}

// forget drops keyID's value, for a key this process deleted: the count
// its next HASH starts with is by the clock of the server that holds it,
// which need not be above every count of the old one (see SyncKey).
// A saw that races it may be dropped; one after it is kept, even if it
// read the old HASH.
func (f *fences) forget(keyID string) { f.m.Delete(keyID) }

// last returns the highest value seen on keyID, 0 if none.
func (f *fences) last(keyID string) int64 {
	v, ok := f.m.Load(keyID)
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

// fresh reports whether keyID's last fence seen is fresh at now (the
// store's clock, ms; see freshFence).
func (f *fences) fresh(keyID string, now int64, fresh time.Duration) bool {
	v := f.last(keyID)
	return v != 0 && freshFence(v, now, fresh)
}

// freshFence reports whether fence, a clock in microseconds (NextFence)
// plus the handoffs since, is under fresh old at now (ms).
func freshFence(fence, now int64, fresh time.Duration) bool {
	return fence >= (now-fresh.Milliseconds())*1000
}

// handoffTo claims the handoff of a caller waiting on ref's key, if ref's
// release on node may grant it (see above); nil if not.
func (s *Store) handoffTo(node *redis.Client, ref LeaseRef) *handoff {
	if s.opts.NoGate || s.opts.MinReplicas > 0 {
		return nil
	}
	if now, ok := s.clock.now(node); !ok || !s.fences.fresh(ref.KeyID, now, s.fenceFresh) {
		return nil
	}
	return s.queue.claim(ref.KeyID, ref.Provider, ref.Pool)
}

// The replies of a handoff's MULTI that settle it, by position in its body.
const (
	handTime = iota
	handScore
	handRemoved
	_ // DEL of the released lease's record
	handKey
	_ // ZADD of the new lease
	handCount
	_ // its record
	_ // its record's expiry
	handFence
	_ // the key's last use
	handSeq
)

// handOver releases ref's lease and grants h in one MULTI on node (see
// above), and returns what Release returns for ref. h is settled either
// way: by the time the reply is read, or, when the grant is refused or its
// outcome unknown, once its lease is deleted.
func (s *Store) handOver(ctx context.Context, node *redis.Client, ref LeaseRef, h *handoff) error {
	keyID := ref.KeyID
	leasesKey, keyKey, old := s.keys.Leases(keyID), s.keys.Key(keyID), member(ref)
	leaseID := uuid.NewString()
	m := rs.Member(leaseID, h.provider, h.pool)
	record := s.keys.Lease(keyID, m)
	now, _ := s.clock.now(node)
	until := now + h.ttl.Milliseconds()
	hmget := cmd{"hmget", keyKey}
	for _, f := range keyFields {
		hmget = append(hmget, f)
	}
	body := []cmd{
		{"time"}, {"zscore", leasesKey, old}, {"zrem", leasesKey, old}, {"del", s.keys.Lease(keyID, old)},
		hmget,
		{"zadd", leasesKey, until, m},
		{"zcard", leasesKey},
		{"hset", record, rs.FieldKeyID, keyID, rs.FieldProvider, h.provider, rs.FieldPool, h.pool, rs.FieldUntil, until},
		{"pexpireat", record, until + s.opts.RecordGrace.Milliseconds()},
		{"hincrby", keyKey, rs.FieldFence, 1},
		{"hset", keyKey, rs.FieldLastUsed, now},
		{"hincrby", keyKey, rs.FieldSeq, 1},
	}
	numsub := cmd{"pubsub", "shardnumsub", s.keys.Free(keyID)}
	seen := s.seqs.last(keyID)
	settled := func(replies []any, then any, err error) {
		var stray bool
		if err == nil {
			listeners, _ := shardNumSub(then)
			s.notices.heard(keyID, listeners)
			lease, ok, gone := s.granted(node, replies, h, keyID, leaseID, until, seen)
			if ok {
				s.fences.saw(keyID, lease.Fence)
				if seq, ok := replyInt(replies, handSeq); ok {
					s.seqs.saw(keyID, seq)
				}
				h.settle(lease, true)
				return
			}
			stray = gone
		}
		// Refused, or of unknown outcome: the lease goes (if that fails
		// too, it is nobody's and expires after its TTL) before the
		// caller tries again, so that it does not find its own slot
		// taken. The released slot, freed or perhaps freed, was this
		// process's turn: a wake-up here, which the caller takes, or
		// hands on if it leaves without trying, and a notice to every
		// listening process if nobody here waits any more.
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), unwatchTimeout)
			defer cancel()
			s.giveBackMembers(ctx, keyID, m)
			if stray {
				// The key was gone: the fence, last-use and count writes
				// made a HASH of their own, which goes too. A key written
				// again meanwhile only loses them: its next fence is by
				// the clock (NextFence), a last use is a ranking hint, and
				// a count from zero is never compared (see lost.go).
				_ = s.rdb.HDel(ctx, keyKey, rs.FieldFence, rs.FieldLastUsed, rs.FieldSeq).Err()
			}
			h.settle(Lease{}, false)
			if n, _ := replyInt(replies, handRemoved); n == 1 || err != nil {
				s.notes.freed(keyID)
				s.wake(keyID)
			}
		}()
	}
	replies, err := s.releases.do(ctx, node, body, numsub, settled)
	if err != nil {
		return err
	}
	return s.released(ctx, node, ref, replies[handTime], replies[handScore], replies[handRemoved])
}

// granted says whether a handoff's MULTI, which replied replies, granted
// h the lease leaseID until (see above), and if not, whether the key was
// gone (the MULTI's HASH writes then made a stray one). A key behind seen,
// the highest grant count this process saw on it before the MULTI, grants
// nothing (see lost.go).
func (s *Store) granted(node *redis.Client, replies []any, h *handoff, keyID, leaseID string, until, seen int64) (lease Lease, ok, stray bool) {
	now, ok := replyMillis(replies[handTime])
	if !ok {
		return Lease{}, false, false
	}
	s.clock.set(node, now)
	vals, _ := replies[handKey].([]any)
	k := parseKey(vals)
	count, _ := replyInt(replies, handCount)
	fence, _ := replyInt(replies, handFence)
	ttl, long := h.ttl.Milliseconds(), until-now
	if !k.member(h.provider, h.pool) || !k.usable(now) || k.behind(seen) || count > int64(k.limit) ||
		!freshFence(k.fence, now, s.fenceFresh) || fence <= 0 || long < ttl/2 || long > ttl+ttl/2 {
		if k.behind(seen) {
			// The MULTI's HINCRBY took the count one up, perhaps to the
			// one seen: the count the store lost is one above that, so
			// that the caller's own try still finds the key behind and
			// holds it back. Without a loss the HASH is above it now.
			s.seqs.saw(keyID, seen+1)
		}
		return Lease{}, false, !k.exists
	}
	return Lease{
		LeaseRef: LeaseRef{Provider: h.provider, Pool: h.pool, KeyID: keyID, LeaseID: leaseID},
		Until:    fromMillis(until),
		Fence:    fence,
	}, true, false
}

// replyInt reads the integer reply at i of an EXEC's replies, if there is
// one.
func replyInt(replies []any, i int) (int64, bool) {
	if i >= len(replies) {
		return 0, false
	}
	n, ok := replies[i].(int64)
	return n, ok
}

// shardNumSub reads a PUBSUB SHARDNUMSUB reply for one channel: its
// subscribers.
func shardNumSub(v any) (int64, bool) {
	r, ok := v.([]any)
	if !ok || len(r) != 2 {
		return 0, false
	}
	n, ok := r[1].(int64)
	return n, ok
}
