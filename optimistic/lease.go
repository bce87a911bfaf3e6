package optimistic

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	rs "github.com/credpool/credpool/internal/redisschema"
)

// Release deletes the lease if key id, provider, pool and lease id all
// match and it has not expired. Otherwise it returns ErrLeaseLost (unknown,
// released or expired; a wrong key id also looks unknown, since the lease
// lives under the key) or ErrLeaseMismatch (wrong provider or pool). On
// Redis Cluster, a master that does not answer or take the write makes it
// fail with ErrUnreachable too, so that a caller releasing on many keys can go on
// with those of the others.
// Releasing twice is harmless: the second call is ErrLeaseLost. It never
// touches another lease; a lease that expired but was not pruned yet is
// removed with its record, as the key's next grant would have done.
//
// One round trip: the owner is part of the lease's member and record names
// (redisschema.Member), so one MULTI removing them can only hit this lease.
// Only when it finds nothing does a second read tell unknown from mismatch.
// Releases of concurrent callers to one server share that round trip
// (see coalescer). If ctx ends before the answer, the lease may or may
// not have been released.
//
// While callers of this process wait for the key (Allocate with Wait) and
// the slot is this process's turn (see Store.turn), the same MULTI hands
// the slot to the first of them, with a lease of its own: the slot is
// never free for anyone else in between, and the caller reads and
// commits nothing. The MULTI reads
// back what it changed, and the caller gets the lease only if the key
// still serves its provider and pool, is usable and within its limit;
// else the lease is deleted and the caller tries the store itself. See
// the handoff notes in the source for what is checked and why.
func (s *Store) Release(ctx context.Context, ref LeaseRef) error {
	if err := ref.Validate(); err != nil {
		return err
	}
	rdb, err := s.owner(ctx, s.keys.Leases(ref.KeyID))
	if err != nil {
		return Classify(ctx, "release", s.markPartial(ctx, err))
	}
	err = s.release(ctx, rdb, ref)
	if rerouted(err) {
		// The slot moved or is moving: let the cluster client follow it.
		err = s.release(ctx, s.rdb, ref)
	}
	return Classify(ctx, "release", s.markPartial(ctx, err))
}

// Node names the server that holds keyID's leases, as this store's client
// routes them now: on Redis Cluster its master's address by the client's
// slot map (a slot that moves since is followed by the calls themselves);
// on other clients "" (one server for every key; a Ring's shards are not
// told apart). Keys on different servers fail apart: a caller retrying
// many releases can go server by server.
func (s *Store) Node(ctx context.Context, keyID string) (string, error) {
	c, ok := s.rdb.(*redis.ClusterClient)
	if !ok {
		return "", nil
	}
	node, err := c.MasterForKey(ctx, s.keys.Leases(keyID))
	if err != nil {
		return "", Classify(ctx, "node", err)
	}
	return node.Options().Addr, nil
}

// Holds returns the lease's expiry if ref holds a live lease, else
// ErrLeaseLost or ErrLeaseMismatch as Release would. It reads only, in one
// round trip: a caller can prove it still holds a lease (before recording
// what it did with it, say) without giving it up.
func (s *Store) Holds(ctx context.Context, ref LeaseRef) (time.Time, error) {
	if err := ref.Validate(); err != nil {
		return time.Time{}, err
	}
	rdb, err := s.owner(ctx, s.keys.Leases(ref.KeyID))
	if err != nil {
		return time.Time{}, Classify(ctx, "holds", err)
	}
	_, until, err := s.holder(ctx, rdb, ref)
	if rerouted(err) {
		_, until, err = s.holder(ctx, s.rdb, ref)
	}
	if err != nil {
		return time.Time{}, Classify(ctx, "holds", err)
	}
	return fromMillis(until), nil
}

// holder reads whether ref holds a live lease, by the clock of the node
// that owns it, and returns that clock's now and the lease's expiry (ms).
// One round trip, and a second (see lost) when the lease is not there.
func (s *Store) holder(ctx context.Context, rdb redis.UniversalClient, ref LeaseRef) (now, until int64, err error) {
	var (
		clock *redis.TimeCmd
		score *redis.FloatCmd
	)
	_, err = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		clock = p.Time(ctx)
		score = p.ZScore(ctx, s.keys.Leases(ref.KeyID), member(ref))
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, 0, err
	}
	now, until = clock.Val().UnixMilli(), int64(score.Val())
	switch {
	case score.Err() != nil:
		return 0, 0, s.lost(ctx, rdb, ref)
	case until <= now:
		return 0, 0, NotHeld(ref.LeaseID, LostExpired)
	}
	return now, until, nil
}

// release removes ref's member and record in one MULTI, which names them
// by owner (see Release); TIME and ZSCORE ride along to tell a live lease
// from one that had expired. The key's free-slot notice (see Await)
// follows EXEC in the same round trip, outside the transaction: inside,
// Redis Cluster would refuse the whole MULTI while the key's slot moves.
// On a plain client (a server, a cluster's master) the round trip is
// shared with other callers' releases (see coalescer). A slot it freed
// wakes the next caller waiting here in line at once (this store's own
// notice is ignored here), even if the caller's ctx ended meanwhile,
// when the slot is this process's turn.
//
// While callers of several processes wait for the key, the slot is freed
// for one process's callers (Store.turn): the notice names it, and only
// its next caller wakes. When it is this process's turn, its waiting
// caller may be handed the slot in the same MULTI instead (see handoff).
func (s *Store) release(ctx context.Context, rdb redis.UniversalClient, ref LeaseRef) error {
	to, expect := s.turn(ref.KeyID)
	plain, ok := rdb.(*redis.Client)
	if ok && to == s.id {
		if h := s.handoffTo(plain, ref); h != nil {
			return s.handOver(ctx, plain, ref, h)
		}
	}
	leasesKey, m := s.keys.Leases(ref.KeyID), member(ref)
	body := []cmd{{"time"}, {"zscore", leasesKey, m}, {"zrem", leasesKey, m}, {"del", s.keys.Lease(ref.KeyID, m)}}
	notice := s.freedFor(ref.KeyID, to)
	// wake wakes whom a freed slot is for. The notice's reply (how many
	// listened) says whether the store named may have missed it (fewer
	// listened than were counted on: it stopped; more: one that was not
	// counted could be passed by), and a notice that got no reply may
	// have reached nobody: either way the slot is announced to every
	// listener.
	wake := func(listeners int64, heard bool) {
		switch {
		case to == "":
			s.queue.Wake(ref.KeyID)
		case to == s.id:
			s.wake(ref.KeyID)
		case !heard || listeners != expect:
			s.queue.Wake(ref.KeyID)
			s.announceFree(ref.KeyID)
		}
	}
	// freed wakes them if the release freed the slot.
	freed := func(replies []any, listeners int64, heard bool) {
		if removed, _ := replies[2].(int64); removed == 1 {
			s.notes.freed(ref.KeyID)
			wake(listeners, heard)
		}
	}
	var (
		replies []any
		err     error
	)
	if ok {
		replies, err = s.releases.do(ctx, plain, body, notice, func(replies []any, then any, err error) {
			if err != nil {
				// Perhaps freed, perhaps announced: a caller woken
				// finds out which.
				wake(0, false)
				return
			}
			if now, ok := replyMillis(replies[0]); ok {
				s.clock.set(plain, now)
			}
			// SPUBLISH's reply: how many listen for the key.
			n, heard := then.(int64)
			if heard {
				s.notices.heard(ref.KeyID, n)
			}
			freed(replies, n, heard)
		})
	} else if replies, err = txPipelinedDo(ctx, rdb, body); err == nil {
		// A client that routes commands itself: the notice goes alone.
		n, err := rdb.Do(ctx, notice...).Int64()
		freed(replies, n, err == nil)
	} else {
		// Perhaps freed, and announced by nobody.
		wake(0, false)
	}
	if err != nil {
		return err
	}
	return s.released(ctx, rdb, ref, replies[0], replies[1], replies[2])
}

// released is Release's answer from the replies of its MULTI's TIME,
// ZSCORE and ZREM of ref's member.
func (s *Store) released(ctx context.Context, rdb redis.UniversalClient, ref LeaseRef, clock, score, removed any) error {
	if n, _ := removed.(int64); n == 0 {
		return s.lost(ctx, rdb, ref)
	}
	now, ok := replyMillis(clock)
	until, _ := replyFloat(score)
	switch {
	case !ok:
		return fmt.Errorf("optimistic: release: unexpected TIME reply %v", clock)
	case int64(until) <= now:
		return NotHeld(ref.LeaseID, LostExpired)
	}
	return nil
}

// replyMillis reads a TIME reply inside EXEC's: seconds and microseconds,
// as strings (RESP2 and RESP3 alike), in milliseconds.
func replyMillis(v any) (int64, bool) {
	parts, _ := v.([]any)
	if len(parts) != 2 {
		return 0, false
	}
	sec, _ := parts[0].(string)
	usec, _ := parts[1].(string)
	s, err1 := strconv.ParseInt(sec, 10, 64)
	us, err2 := strconv.ParseInt(usec, 10, 64)
	return s*1000 + us/1000, err1 == nil && err2 == nil
}

// replyFloat reads a score inside EXEC's reply: a double (RESP3) or a
// string (RESP2); nil (no such member) is false.
func replyFloat(v any) (float64, bool) {
	switch v := v.(type) {
	case float64:
		return v, true
	case string:
		f, err := strconv.ParseFloat(v, 64)
		return f, err == nil
	}
	return 0, false
}

// lost says why ref's member is not in its key's lease ZSET, in one more
// round trip: the lease id is there under another provider or pool
// (LostMismatch), or not at all (LostUnknown: never granted, released,
// pruned, or asked under another key id). A lease written before owners
// were encoded (a bare lease id) is unknown too: it expires by itself.
func (s *Store) lost(ctx context.Context, rdb redis.UniversalClient, ref LeaseRef) error {
	members, err := rdb.ZRange(ctx, s.keys.Leases(ref.KeyID), 0, -1).Result()
	if err != nil {
		return err
	}
	for _, m := range members {
		if rs.OfLease(m, ref.LeaseID) {
			return NotHeld(ref.LeaseID, LostMismatch)
		}
	}
	return NotHeld(ref.LeaseID, LostUnknown)
}

// member is ref's member in its key's lease ZSET.
func member(ref LeaseRef) string { return rs.Member(ref.LeaseID, ref.Provider, ref.Pool) }

// Renew moves a live lease's expiry to now+ttl (store clock) and returns it.
// A lease that expired, was released or pruned, or does not match is lost
// (ErrLeaseLost, ErrLeaseMismatch) and is never recreated. On error nothing
// is written. Renew does not take the key's gate (see Allocate): a
// heartbeat never queues behind this process's allocations.
//
// It needs no WATCH, so it never conflicts: a renewal on a hot key never
// fails as contended. The lease id is unique and ZADD XX only updates a
// member still there: a lease released or pruned since the read stays
// gone. One that expires between the read and the write may be extended,
// which is safe: an allocator that counted it expired either pruned it
// first (the write then finds nothing) or watches the lease ZSET, so the
// write aborts its EXEC and it reads again.
func (s *Store) Renew(ctx context.Context, ref LeaseRef, ttl time.Duration) (time.Time, error) {
	if err := ref.Validate(); err != nil {
		return time.Time{}, err
	}
	if err := CheckTTL(ttl); err != nil {
		return time.Time{}, err
	}
	rdb, err := s.owner(ctx, s.keys.Leases(ref.KeyID))
	if err != nil {
		return time.Time{}, Classify(ctx, "renew", err)
	}
	until, err := s.renew(ctx, rdb, ref, ttl)
	if rerouted(err) {
		until, err = s.renew(ctx, s.rdb, ref, ttl)
	}
	if err != nil {
		return time.Time{}, Classify(ctx, "renew", err)
	}
	return fromMillis(until), nil
}

func (s *Store) renew(ctx context.Context, rdb redis.UniversalClient, ref LeaseRef, ttl time.Duration) (int64, error) {
	m := member(ref)
	leasesKey, recordKey := s.keys.Leases(ref.KeyID), s.keys.Lease(ref.KeyID, m)
	now, _, err := s.holder(ctx, rdb, ref)
	if err != nil {
		return 0, err
	}
	until := now + ttl.Milliseconds()
	replies, err := s.write(ctx, rdb, []cmd{
		{"zadd", leasesKey, "xx", until, m},
		{"zscore", leasesKey, m},
		{"hset", recordKey, rs.FieldUntil, until},
		{"pexpireat", recordKey, until + s.opts.RecordGrace.Milliseconds()},
	})
	if err != nil {
		// errUnreplicated included: the new expiry may not survive a
		// failover, so the holder must go by the previous one.
		return 0, err
	}
	if len(replies) < 2 || replies[1] == nil {
		// Gone since the read: the HSET made a stray record of it. Deleted
		// even after ctx ended, and bounded as an UNWATCH is; if this
		// fails, the record expires by itself after RecordGrace.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unwatchTimeout)
		defer cancel()
		_ = rdb.Del(dctx, recordKey).Err()
		return 0, NotHeld(ref.LeaseID, LostExpired)
	}
	return until, nil
}
