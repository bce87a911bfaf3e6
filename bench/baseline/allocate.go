package baseline

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	rs "github.com/credpool/credpool/internal/redisschema"
	"github.com/credpool/credpool/optimistic"
)

// Allocate leases a slot on the first candidate, in the given order, that is
// a member of req.Provider/req.Pool, is usable, and has fewer live leases
// than its limit. It runs allocate.lua once per candidate and stops at the
// first grant: Stats.Attempts counts the runs, and Stats.Conflicts stays 0
// since nothing can interleave with a script. It returns a
// *optimistic.CapacityError (ErrNoCapacity) when no candidate has room and
// an ErrStore on Redis failure.
//
// With Options.Gate, each run holds its candidate's turn in this process,
// and a candidate whose turn another call holds is tried after the others,
// and waited for only once every candidate left is busy, as the
// optimistic store does for keys whose turn is taken: the order is then a
// preference, as there.
//
// On error no lease is held, unless a granting run's reply was lost and
// go-redis did not resend it; that lease expires by itself after TTL.
func (s *Store) Allocate(ctx context.Context, req optimistic.AllocateRequest) (optimistic.Lease, optimistic.Stats, error) {
	var st optimistic.Stats
	if err := req.Validate(); err != nil {
		return optimistic.Lease{}, st, err
	}
	if req.Wait > 0 {
		// The seed's design has callers retry; the benchmark compares
		// waiting on the stores that can.
		return optimistic.Lease{}, st, fmt.Errorf("%w: wait: the Lua baseline does not wait for a slot", optimistic.ErrInvalid)
	}
	// One lease id per call: a resent run recognises its own grant by it.
	leaseID := uuid.NewString()
	var full optimistic.CapacityError
	type step struct {
		keyID string
		wait  bool // for the gate; else put the key last while it is taken
	}
	queue := make([]step, len(req.Candidates))
	for i, id := range req.Candidates {
		queue[i] = step{keyID: id}
	}
	// busy counts the candidates found busy one after the other: the call
	// waits for a turn only once every candidate left is busy, as the
	// optimistic store's does (which then waits for the one likely to
	// come free first by its hold-offs; a script loses no races, so here
	// that is the first).
	busy := 0
	for i := 0; i < len(queue); i++ {
		keyID := queue[i].keyID
		release, ok, err := s.enter(ctx, keyID, queue[i].wait && busy >= len(queue)-i)
		if err != nil {
			return optimistic.Lease{}, st, optimistic.Classify(ctx, "allocate", err)
		}
		if !ok {
			busy++
			queue = append(queue, step{keyID: keyID, wait: true})
			continue
		}
		busy = 0
		st.Attempts++
		res, err := s.claim(ctx, req, keyID, leaseID)
		release()
		if err != nil {
			return optimistic.Lease{}, st, optimistic.Classify(ctx, "allocate", err)
		}
		if res[0] == 1 {
			st.Pruned = int(res[3])
			return optimistic.Lease{
				LeaseRef: optimistic.LeaseRef{Provider: req.Provider, Pool: req.Pool, KeyID: keyID, LeaseID: leaseID},
				Until:    time.UnixMilli(res[1]),
				Fence:    res[2],
			}, st, nil
		}
		var at time.Time // 0: never frees up by itself
		if res[1] != 0 {
			at = time.UnixMilli(res[1])
		}
		full.Merge(at, res[2] == 1)
	}
	return optimistic.Lease{}, st, &full
}

// enter takes keyID's turn with Options.Gate, at once if another call does
// not hold it; if one does, it waits for it when wait, and otherwise
// returns ok false, holding nothing. Waiting holds no pooled connection
// and ends with ctx. Without Options.Gate it lets every call through.
func (s *Store) enter(ctx context.Context, keyID string, wait bool) (release func(), ok bool, err error) {
	switch {
	case !s.opts.Gate:
		return func() {}, true, nil
	case wait:
		release, err = s.gates.Enter(ctx, keyID)
		return release, err == nil, err
	}
	release, ok = s.gates.TryEnter(keyID)
	return release, ok, nil
}

// claim runs allocate.lua on one candidate: {1, lease_until, fence, pruned}
// on a grant, else {0, free_at, held}.
func (s *Store) claim(ctx context.Context, req optimistic.AllocateRequest, keyID, leaseID string) ([]int64, error) {
	member := rs.Member(leaseID, req.Provider, req.Pool)
	keys := []string{s.keys.Key(keyID), s.keys.Leases(keyID), s.keys.Lease(keyID, member)}
	return allocateScript.Run(ctx, s.rdb, keys,
		keyID, req.Provider, req.Pool, member, req.TTL.Milliseconds(),
		s.opts.RecordGrace.Milliseconds(), s.keys.Lease(keyID, ""),
	).Int64Slice()
}
