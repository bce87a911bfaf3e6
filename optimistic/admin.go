package optimistic

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	rs "github.com/credpool/credpool/internal/redisschema"
)

// SyncKey upserts a key's allocation state into its HASH and its pool
// membership, moving it out of its old pool if provider or pool changed.
// On Redis Cluster, a master that does not answer or take the write (the
// key's, or its pool's) makes it fail with ErrUnreachable too, so that a caller syncing
// many keys can go on with the others.
// Leases, the fencing counter, the grant count (a new HASH's starts from
// the clock), a hold after a loss (see Options.LostHold) and a stored
// last_used_at are kept:
// k.LastUsedAt only fills in a missing one, with HSETNX, so that a grant
// committed meanwhile is never overwritten. Allocate checks membership on
// the HASH, so a partial failure can at worst leave a stale member in an
// old pool's ZSET, which nothing reads; syncing again repairs it.
func (s *Store) SyncKey(ctx context.Context, k KeyState) error {
	if err := k.Validate(); err != nil {
		return err
	}
	keyKey := s.keys.Key(k.ID)
	old, err := s.rdb.HMGet(ctx, keyKey, rs.FieldProvider, rs.FieldPool).Result()
	if err != nil {
		return Classify(ctx, "sync key", s.markPartial(ctx, err))
	}
	oldProvider, _ := old[0].(string)
	oldPool, _ := old[1].(string)
	var seed int64
	if oldProvider == "" {
		// A HASH made anew starts its grant count from the store's clock,
		// above every count a process saw on the key before it was
		// deleted or lost, so that it is never found behind for that,
		// and a loss before its first grant is noticed (see lost.go).
		if seed, err = s.clockMicros(ctx, keyKey); err != nil {
			return Classify(ctx, "sync key", s.markPartial(ctx, err))
		}
	}
	cooldown := ""
	if !k.CooldownUntil.IsZero() {
		cooldown = strconv.FormatInt(k.CooldownUntil.UnixMilli(), 10)
	}
	// Separate commands, not MULTI: the pool ZSETs live in other slots.
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, keyKey, rs.FieldProvider, k.Provider, rs.FieldPool, k.Pool, rs.FieldStatus, string(k.Status),
			rs.FieldCooldown, cooldown, rs.FieldLimit, k.MaxConcurrentUses)
		if !k.LastUsedAt.IsZero() {
			p.HSetNX(ctx, keyKey, rs.FieldLastUsed, k.LastUsedAt.UnixMilli())
		}
		if seed > 0 {
			p.HSetNX(ctx, keyKey, rs.FieldSeq, seed)
		}
		p.ZAdd(ctx, s.keys.Pool(k.Provider, k.Pool), redis.Z{Score: k.Score, Member: k.ID})
		if oldProvider != "" && (oldProvider != k.Provider || oldPool != k.Pool) {
			p.ZRem(ctx, s.keys.Pool(oldProvider, oldPool), k.ID)
		}
		// A limit raised or a key made usable may free several slots:
		// every caller waiting on it looks again.
		p.Do(ctx, s.notice(k.ID, noticeAll)...)
		return nil
	})
	if err == nil {
		s.notes.freed(k.ID)
		s.queue.WakeAll(k.ID)
	}
	return Classify(ctx, "sync key", s.markPartial(ctx, err))
}

// clockMicros reads the clock of the server that holds key, in
// microseconds.
func (s *Store) clockMicros(ctx context.Context, key string) (int64, error) {
	node, err := s.owner(ctx, key)
	if err != nil {
		return 0, err
	}
	now, err := node.Time(ctx).Result()
	return now.UnixMicro(), err
}

// DeleteKey removes the key's pool membership, then in one transaction its
// HASH, its lease ZSET and every lease record. Holders of its leases lose
// them. Deleting a missing key is not an error. The pool ZSET lives in
// another slot, so it goes first: if the transaction then fails, the key
// is still there and deleting again finishes the job.
func (s *Store) DeleteKey(ctx context.Context, keyID string) error {
	if err := CheckKeyIDs(keyID); err != nil {
		return err
	}
	owner, err := s.rdb.HMGet(ctx, s.keys.Key(keyID), rs.FieldProvider, rs.FieldPool).Result()
	if err != nil {
		return Classify(ctx, "delete key", err)
	}
	if provider, _ := owner[0].(string); provider != "" {
		pool, _ := owner[1].(string)
		if err := s.rdb.ZRem(ctx, s.keys.Pool(provider, pool), keyID).Err(); err != nil {
			return Classify(ctx, "delete key", err)
		}
	}
	err = s.retry(ctx, func() error {
		_, err := s.dropLeases(ctx, keyID, true)
		return err
	})
	if err == nil {
		s.seqs.forget(keyID)
	}
	return Classify(ctx, "delete key", err)
}

// ClearLeases force-releases every lease of the key (an admin action) and
// returns how many there were, expired ones included. Their holders lose
// them. On error nothing is removed.
func (s *Store) ClearLeases(ctx context.Context, keyID string) (int, error) {
	if err := CheckKeyIDs(keyID); err != nil {
		return 0, err
	}
	var n int
	err := s.retry(ctx, func() (err error) {
		n, err = s.dropLeases(ctx, keyID, false)
		return err
	})
	if err != nil {
		return 0, Classify(ctx, "clear leases", err)
	}
	return n, nil
}

// dropLeases deletes, in one transaction, the key's lease ZSET and every
// lease record in it, plus the key HASH when withKey. It returns the number
// of leases removed.
func (s *Store) dropLeases(ctx context.Context, keyID string, withKey bool) (int, error) {
	keyKey, leasesKey := s.keys.Key(keyID), s.keys.Leases(keyID)
	release, err := s.enter(ctx, keyID, true)
	if err != nil {
		return 0, err
	}
	defer release()
	var ids []string
	err = s.watch(ctx, []string{keyKey, leasesKey}, func(t *txn) error {
		var leases *redis.StringSliceCmd
		err := t.read(ctx, func(p redis.Pipeliner) {
			leases = p.ZRange(ctx, leasesKey, 0, -1)
		})
		if err != nil {
			return err
		}
		ids = leases.Val()
		if len(ids) == 0 && !withKey {
			return nil
		}
		dels := cmd{"del", leasesKey}
		for _, id := range ids {
			dels = append(dels, s.keys.Lease(keyID, id))
		}
		if withKey {
			dels = append(dels, keyKey)
		}
		return t.commit(ctx, []cmd{dels})
	})
	if err == nil && !withKey && len(ids) > 0 {
		// Outside the MULTI, which Redis Cluster would refuse whole while
		// the key's slot migrates; an admin action can afford the round
		// trip. Lost, it costs waiters elsewhere a poll.
		_ = s.rdb.Do(ctx, s.notice(keyID, noticeAll)...).Err()
		s.notes.freed(keyID)
		s.queue.WakeAll(keyID)
	}
	return len(ids), err
}

// Inspect reads the live state of each key in one pipelined round trip.
// Missing keys come back with Exists false. On Redis Cluster a key whose
// master does not answer comes back Unreachable instead of failing the
// call (FreeAt is then judged by this host's clock if the node asked for
// the time was the one down), unless no key's master answered: that is
// an ErrStore with ErrUnreachable. On other clients any failure fails it.
func (s *Store) Inspect(ctx context.Context, keyIDs ...string) ([]KeyInfo, error) {
	if err := CheckKeyIDs(keyIDs...); err != nil {
		return nil, err
	}
	var (
		clock  *redis.TimeCmd
		hashes = make([]*redis.SliceCmd, len(keyIDs))
		leases = make([]*redis.ZSliceCmd, len(keyIDs))
		seen   = make([]int64, len(keyIDs))
	)
	for i, id := range keyIDs {
		if !s.replicaReads {
			seen[i] = s.seqs.last(id)
		}
	}
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		clock = p.Time(ctx)
		for i, id := range keyIDs {
			hashes[i] = p.HMGet(ctx, s.keys.Key(id), keyFields...)
			leases[i] = p.ZRangeWithScores(ctx, s.keys.Leases(id), 0, -1)
		}
		return nil
	})
	if err != nil && !s.cluster {
		return nil, Classify(ctx, "inspect", err)
	}
	// On a cluster each node's commands have their own outcome: those
	// sent to a master that is down fail alone.
	now := clock.Val().UnixMilli()
	if cerr := clock.Err(); cerr != nil {
		if !s.partial(ctx, cerr) {
			return nil, Classify(ctx, "inspect", cerr)
		}
		now = time.Now().UnixMilli()
	}
	out := make([]KeyInfo, len(keyIDs))
	answered := 0
	for i, id := range keyIDs {
		if kerr := errors.Join(hashes[i].Err(), leases[i].Err()); kerr != nil {
			if !s.partial(ctx, kerr) {
				return nil, Classify(ctx, "inspect", kerr)
			}
			out[i] = KeyInfo{ID: id, Unreachable: true}
			continue
		}
		answered++
		k, ls := parseKey(hashes[i].Val()), splitLeases(leases[i].Val(), now)
		if k.behind(seen[i]) {
			k.held = max(k.held, s.holdLost(ctx, id, seen[i]))
		}
		if !s.replicaReads {
			s.sawRead(id, k)
		}
		cd, _ := parseMillis(k.cooldown)
		free, _ := freeAt(k, ls, now)
		out[i] = KeyInfo{
			ID: id, Exists: k.exists, Provider: k.provider, Pool: k.pool, Status: k.status,
			CooldownUntil: fromMillis(cd), Limit: k.limit, Live: ls.live,
			FreeAt: fromMillis(free), Fence: k.fence, LastUsedAt: fromMillis(k.lastUsed),
		}
		if k.held > now {
			out[i].HeldUntil = fromMillis(k.held)
		}
	}
	if answered == 0 && len(keyIDs) > 0 {
		return nil, Classify(ctx, "inspect", s.markPartial(ctx, err))
	}
	return out, nil
}
