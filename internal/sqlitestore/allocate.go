package sqlitestore

import (
	"context"
	"database/sql"
	"time"

	"github.com/google/uuid"

	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
)

// Allocate leases a slot on the first candidate, in the given order, that is
// a member of req.Provider/req.Pool, is usable, and has fewer live leases
// than its limit. It returns a *CapacityError (ErrNoCapacity) when none has,
// ErrContended when the file stayed busy past the retry budget, and an
// ErrStore when SQLite fails.
//
// One IMMEDIATE transaction walks the candidates and claims the first with
// room: it prunes that key's expired leases, writes the lease, marks the
// key available with no cooldown, stamps last_used_at and bumps its
// fencing counter. On error nothing is written. Stats.Attempts
// counts transactions tried, Stats.Conflicts those retried because the file
// was busy.
//
// With req.Wait, a call that finds no free slot waits in line (see Await).
func (s *Store) Allocate(ctx context.Context, req optimistic.AllocateRequest) (optimistic.Lease, optimistic.Stats, error) {
	if err := req.Validate(); err != nil {
		return optimistic.Lease{}, optimistic.Stats{}, err
	}
	if req.Wait > 0 {
		return optimistic.AllocateWaiting(ctx, s, req, s.allocate)
	}
	return s.allocate(ctx, req)
}

// allocate is one Allocate call without waiting: req is valid.
func (s *Store) allocate(ctx context.Context, req optimistic.AllocateRequest) (optimistic.Lease, optimistic.Stats, error) {
	leaseID := uuid.NewString()
	var c claimed
	st, err := s.do(ctx, false, func(tx *sql.Tx, now int64) (err error) {
		c, err = s.claim(ctx, tx, req, leaseID, now)
		return err
	})
	st.Pruned = c.pruned
	switch {
	case err != nil:
		return optimistic.Lease{}, st, sqlitex.Classify(ctx, "allocate", err)
	case c.lease.KeyID == "":
		return optimistic.Lease{}, st, &c.full
	}
	s.changed()
	// Expired leases pruned here freed slots nobody was told of: callers
	// waiting in line behind the one whose FreeAt brought it here would
	// otherwise find them one poll at a time. The caller granted, if in
	// line itself, is passed over.
	for range min(c.pruned, c.room) {
		s.queue.WakeOthers(ctx, c.lease.KeyID)
	}
	return c.lease, st, nil
}

// claimed is what Allocate's transaction found: a lease, how many
// expired leases of its key it pruned and how many slots the key has free
// after it, or none and what the skipped members said.
type claimed struct {
	lease  optimistic.Lease
	full   optimistic.CapacityError
	pruned int
	room   int
}

// claim is the body of Allocate's transaction. Like the Redis stores it
// prunes only the key it grants on, so Stats.Pruned means the same. It
// reads one candidate at a time, under the write lock: the first usually
// has room, and reading all of them at once costs more than it saves.
func (s *Store) claim(ctx context.Context, tx *sql.Tx, req optimistic.AllocateRequest, leaseID string, now int64) (claimed, error) {
	var c claimed
	for _, id := range req.Candidates {
		keys, err := s.readKeys(ctx, tx, []string{id}, now)
		if err != nil {
			return claimed{}, err
		}
		k := keys[0]
		if !k.member(req.Provider, req.Pool) {
			continue
		}
		if !k.canGrant(now) {
			at, held := optimistic.FreeAt(k.status, k.cooldown, k.limit, k.live, k.first, now)
			c.full.Merge(fromMillis(at), held)
			continue
		}
		res, err := s.on(ctx, tx, qPrune).ExecContext(ctx, id, now)
		if err != nil {
			return claimed{}, err
		}
		if n, err := res.RowsAffected(); err == nil {
			c.pruned = int(n)
		}
		// The clock again, for microseconds: under the write lock, so still
		// after every grant committed before this one.
		until, fence := now+req.TTL.Milliseconds(), optimistic.NextFence(k.fence, time.Now())
		if _, err := s.on(ctx, tx, qInsertLease).ExecContext(ctx, leaseID, id, req.Provider, req.Pool, until); err != nil {
			return claimed{}, err
		}
		if _, err := s.on(ctx, tx, qGrantKey).ExecContext(ctx, string(optimistic.StatusAvailable), now, fence, id); err != nil {
			return claimed{}, err
		}
		c.lease = optimistic.Lease{
			LeaseRef: optimistic.LeaseRef{Provider: req.Provider, Pool: req.Pool, KeyID: id, LeaseID: leaseID},
			Until:    fromMillis(until),
			Fence:    fence,
		}
		c.room = k.limit - k.live - 1
		return c, nil
	}
	return c, nil
}
