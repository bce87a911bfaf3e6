package optimistic

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
)

// errSeenFull says that the call holding a key's turn read it with no
// slot for the caller (see ticket).
var errSeenFull = errors.New("optimistic: key read full by the call holding its turn")

// maxBatch bounds the calls one grant serves besides its own, so that one
// MULTI stays small whatever the key's limit.
const maxBatch = 16

// A call that waits for a key's turn (see enter) leaves a ticket in the
// key's line. The turn's holder, finding room for more than its own
// lease, grants waiting tickets in the same MULTI (in arrival order, each
// with its own lease id, expiry and fence) and hands each its outcome
// before it gives the turn up. On a hot key of one process, grants then
// cost one read and one EXEC per batch instead of per call: the key's
// turn, not its slots, had bounded them.
//
// A ticket whose holder's EXEC reply was lost is rechecked by its own call
// (see allocation.pending), as a lost reply of its own would be; one
// whose EXEC aborted, or wrote nothing, goes back to waiting for the turn.
//
// A holder that reads the key full, or unusable, answers with that read
// the tickets of its provider and pool whose callers wait for a slot
// (WithWaiting) and that were posted before the read was sent: they go
// on to their other candidates, or back to waiting, at once, instead of
// each waiting for the turn to read the same answer, one round trip after
// the other (see "One read answers the line" in the README). The read
// came after the ticket, so after any wake-up its caller took: a slot
// freed before it shows in it, and one freed after it wakes a caller in
// line, as after a read of the caller's own. A ticket posted while the
// read was on the wire waits for the turn and reads for itself. Retrying
// callers always read for themselves: told "no slot" at once, they came
// back together after their pause and got fewer grants.
type ticket struct {
	provider, pool string
	member         string // the call's member in the lease ZSET
	ttlMillis      int64
	waits          bool   // its caller waits for a slot (see deny)
	seq            uint64 // its place among the tickets posted (see lines.mark)

	// Set by the holder that claimed it, before done is closed.
	granted bool
	recheck bool // the EXEC's outcome is unknown
	until   int64
	fence   int64
	full    bool  // the holder read the key with no slot (see deny)
	free    int64 // then when it frees up (ms), 0 if never by itself
	held    bool  // free is when a held lease ends
	done    chan struct{}
	wake    context.CancelFunc // ends the owner's wait for the turn
}

// lines holds the tickets waiting for each key's turn in this process. It
// is safe for concurrent use.
type lines struct {
	mu     sync.Mutex
	m      map[string][]*ticket
	posted atomic.Uint64 // tickets posted so far; added to under mu
}

// post adds t to keyID's line.
func (l *lines) post(keyID string, t *ticket) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = make(map[string][]*ticket)
	}
	t.seq = l.posted.Add(1)
	l.m[keyID] = append(l.m[keyID], t)
}

// mark returns a mark of the tickets posted so far, for deny. It takes
// no lock: every Allocate's read calls it.
func (l *lines) mark() uint64 { return l.posted.Load() }

// withdraw takes t out of keyID's line and says whether it was still
// there: false means a holder claimed it, and will close t.done.
func (l *lines) withdraw(keyID string, t *ticket) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	line := l.m[keyID]
	i := slices.Index(line, t)
	if i < 0 {
		return false
	}
	l.cut(keyID, slices.Delete(line, i, i+1))
	return true
}

// claim takes up to n tickets of keyID's line, in order, that member
// accepts (the key's provider and pool).
func (l *lines) claim(keyID string, n int, member func(provider, pool string) bool) []*ticket {
	return l.take(keyID, n, func(t *ticket) bool { return member(t.provider, t.pool) })
}

// take takes up to n tickets of keyID's line, in order, that want.
func (l *lines) take(keyID string, n int, want func(*ticket) bool) []*ticket {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*ticket
	line := l.m[keyID]
	kept := line[:0]
	for _, t := range line {
		if len(out) < n && want(t) {
			out = append(out, t)
			continue
		}
		kept = append(kept, t)
	}
	clear(line[len(kept):])
	l.cut(keyID, kept)
	return out
}

// cut sets keyID's line, dropping it when empty: a key nobody waits for
// keeps nothing behind.
func (l *lines) cut(keyID string, line []*ticket) {
	if len(line) == 0 {
		delete(l.m, keyID)
		return
	}
	l.m[keyID] = line
}

// settleTickets hands claimed tickets their outcome: granted if the MULTI that
// carried them committed, to be rechecked if its outcome is unknown, else
// nothing (their calls go back to waiting for the turn).
func settleTickets(ts []*ticket, granted, recheck bool) {
	for _, t := range ts {
		t.granted, t.recheck = granted, recheck
		close(t.done)
		t.wake()
	}
}

// deny answers the tickets in keyID's line of provider and pool whose
// callers wait for a slot, posted by the time of mark (see lines.mark),
// with a read of the key made after that which found no slot for them:
// free and held as freeAt says.
func (l *lines) deny(keyID, provider, pool string, mark uint64, free int64, held bool) {
	ts := l.take(keyID, math.MaxInt, func(t *ticket) bool {
		return t.waits && t.seq <= mark && t.provider == provider && t.pool == pool
	})
	for _, t := range ts {
		t.full, t.free, t.held = true, free, held
		close(t.done)
		t.wake()
	}
}

// queueFor waits for keyID's turn, holding a ticket in its line meanwhile,
// and returns the turn's release; or, if a holder of the turn granted the
// ticket first, it returns granted with the lease set (or errRecheck, with
// the key pending, if that grant's outcome is unknown). If ctx ends first
// it returns ctx's error and holds nothing: a ticket claimed meanwhile is
// waited for (its holder's commit, bounded by coalesceTimeout), and its
// lease, granted or of unknown outcome, given back.
//
// A ticket whose holder's commit wrote nothing goes to the back of the
// line and of the turn's queue: that happens only when another process's
// grant or a refused write aborted it.
func (a *allocation) queueFor(ctx context.Context, keyID string) (release func(), granted bool, err error) {
	for {
		wait, wake := context.WithCancel(ctx)
		t := &ticket{
			provider: a.req.Provider, pool: a.req.Pool, member: a.member,
			ttlMillis: a.req.TTL.Milliseconds(), waits: a.waits, done: make(chan struct{}), wake: wake,
		}
		a.lines.post(keyID, t)
		turn, enterErr := a.gates.Enter(wait, keyID)
		claimed := !a.lines.withdraw(keyID, t)
		wake()
		switch {
		case enterErr == nil && claimed:
			// Its holder settled it before giving the turn up.
			turn()
		case enterErr == nil:
			return turn, false, nil
		case ctx.Err() != nil && !claimed:
			return nil, false, enterErr
		}
		<-t.done
		switch {
		case ctx.Err() != nil:
			if t.granted || t.recheck {
				// Its lease id is this call's alone: a give-back of a
				// lease that never landed removes nothing.
				a.giveBack(ctx, keyID)
			}
			return nil, false, ctx.Err()
		case t.recheck:
			a.pending = keyID
			return nil, false, errRecheck
		case t.full:
			a.full.Merge(fromMillis(t.free), t.held)
			return nil, false, errSeenFull
		case t.granted:
			a.grant(keyID, t.until, t.fence)
			return nil, true, nil
		}
	}
}
