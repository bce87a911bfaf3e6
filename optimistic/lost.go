package optimistic

import (
	"context"

	"github.com/redis/go-redis/v9"

	rs "github.com/credpool/credpool/internal/redisschema"
)

// Redis may come back from a copy older than its last writes: a restart
// from an RDB snapshot or from an AOF that lost its last second, a
// failover to a replica that had not caught up. The keys are all there,
// but the leases granted since are not: their holders still use them
// while the store counts their slots free. A store notices it by the
// key's grant count (rs.FieldSeq): it starts from the clock (µs) when
// SyncKey makes the HASH (or at the first grant of a HASH without one),
// every grant and handoff adds one, and nothing lowers it. Each process
// keeps the highest count it saw on each key (Store.seqs), granted by
// itself or read. A read of the key HASH whose count is below the one
// seen before the read was sent is behind (keyState.behind). Only reads
// that masters answer count: with MinReplicas, grants alone (see
// sawRead), and through a client that may send Inspect's reads to
// replicas, none of those (Store.replicaReads).
//
// A count, unlike the fence, which jumps to the clock at each grant, goes
// up by one: a process that saw no lost grant and grants first after the
// loss does not hide it from one that did, until it has granted as many
// times as were lost. (Rankings read every instance's hottest keys every
// few hundred milliseconds, so each has seen recent counts.)
//
// A key found behind is held back for Options.LostHold, the longest a
// forgotten lease may still be in use: the hold is a field of the key
// HASH (rs.FieldHeld), so every process refuses the key until it ends,
// and SyncKey, which writes the rest of the HASH from the caller's
// source of truth, leaves it alone. The same MULTI raises the count to
// the one seen, so that this process holds the key once per loss;
// another that saw a later grant still finds it behind, and holds it
// again, from then.
//
// What it cannot notice: a loss of grants no running process saw (made
// by processes that restarted since, and read by none that runs), or
// one that processes granting since the loss made up for before any
// that saw the lost grants read the key; a loss on a key whose HASH has
// no count started from the clock (a HASH from before this release, not
// granted since; a count from zero that a handoff's HINCRBY made on one
// without a count, or that a handoff's clean-up left there while SyncKey
// made the key again). A store whose lost key is missing altogether reads
// it as not existing: that is for the caller's source of truth to tell
// (the service's catalog, see SyncKey).

// hold holds keyID back, inside t: k, read under WATCH at now (ms), is
// behind seen. It returns when the hold ends.
func (s *Store) hold(ctx context.Context, t *txn, keyID string, k keyState, seen, now int64) (int64, error) {
	until := max(k.held, now+s.opts.LostHold.Milliseconds())
	err := t.commit(ctx, []cmd{{"hset", s.keys.Key(keyID), rs.FieldHeld, until, rs.FieldSeq, seen}})
	return until, err
}

// sawRead records the grant count of k, read from keyID's HASH. With
// MinReplicas a read may find a grant that too few replicas acknowledged
// and that a failover then loses as it should, its holder having been
// told it failed: only acknowledged grants are recorded there.
func (s *Store) sawRead(keyID string, k keyState) {
	if k.exists && s.opts.MinReplicas == 0 {
		s.seqs.saw(keyID, k.seq)
	}
}

// holdLost is hold in a transaction of its own, for a read outside one
// (Inspect) that found keyID behind seen, and returns the key's hold as
// it then is (held_until, 0 if none: it was not behind any more), or 0
// if holding it failed. It makes one try, and none while a call of this
// process has the key's turn: a read need not wait or fail for it, as
// the next read (a grant's at the latest) finds the key behind again.
func (s *Store) holdLost(ctx context.Context, keyID string, seen int64) int64 {
	release, err := s.enter(ctx, keyID, false)
	if err != nil {
		return 0
	}
	defer release()
	keyKey := s.keys.Key(keyID)
	var until int64
	_ = s.watch(ctx, []string{keyKey}, func(t *txn) error {
		var (
			clock *redis.TimeCmd
			hash  *redis.SliceCmd
		)
		err := t.read(ctx, func(p redis.Pipeliner) {
			clock = p.Time(ctx)
			hash = p.HMGet(ctx, keyKey, keyFields...)
		})
		if err != nil {
			return err
		}
		k := parseKey(hash.Val())
		if !k.behind(seen) {
			until = k.held
			return nil
		}
		held, err := s.hold(ctx, t, keyID, k, seen, clock.Val().UnixMilli())
		if err == nil {
			until = held
		}
		return err
	})
	return until
}
