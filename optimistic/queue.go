package optimistic

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// WaitPoll bounds how long a waiting caller goes without asking the store
// again: a wake-up that never came (a notification lost with its
// connection, a slot freed by a sync on another host, a release in another
// process of a store that cannot notify) costs at most about this long.
const WaitPoll = time.Second

// minWaitStep keeps a caller told "frees up now" (a FreeAt in the past by
// this host's clock) from spinning on the store.
const minWaitStep = 2 * time.Millisecond

// Queue lines up this process's callers that wait for a free slot, per
// key, in arrival order. A slot freed on a key wakes the earliest caller
// waiting on it that is not already awake, so callers are served in turn
// and one release wakes one caller, not a herd. The zero Queue is ready to
// use; it is safe for concurrent use. Nothing of it lives outside this
// process.
type Queue struct {
	mu    sync.Mutex
	seq   uint64
	lines map[string][]*Place // by key id, in arrival order
	n     int                 // places in line
}

// Place is one caller's place in a Queue, on the keys it waits for. It is
// used by one goroutine (Wait, Retry, Leave); the Queue wakes it from any.
type Place struct {
	q    *Queue
	keys []string
	seq  uint64
	// wake holds the key of a wake-up not yet taken: one at most, a
	// second goes to the next caller in line.
	wake chan string
	// parked says p waits in Wait: it found no slot, or waits for its
	// turn. Guarded by q.mu.
	parked bool
	leave  func()
	left   bool
	waited time.Duration
}

// Join puts a new place at the end of the line of each of keyIDs. The
// place must be left (Leave).
func (q *Queue) Join(keyIDs []string) *Place {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.lines == nil {
		q.lines = make(map[string][]*Place)
	}
	q.seq++
	p := &Place{q: q, keys: distinct(keyIDs), seq: q.seq, wake: make(chan string, 1)}
	for _, id := range p.keys {
		q.lines[id] = append(q.lines[id], p)
	}
	q.n++
	return p
}

// Wake hands a freed slot on keyID to the earliest caller waiting on it
// that holds no wake-up yet; with none, it does nothing (callers that are
// trying the store right now see the slot themselves).
func (q *Queue) Wake(keyID string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, p := range q.lines[keyID] {
		select {
		case p.wake <- keyID:
			return
		default:
		}
	}
}

// Len returns how many callers wait in line.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// Behind reports whether on each of p's keys a caller who joined earlier
// is parked in Wait, having found no slot: a caller that has just joined
// then waits for its turn instead of taking a slot from under them.
// Callers ahead that are still trying do not count: while nobody has
// found the keys full, everyone may try, so all the slots fill.
func (p *Place) Behind() bool {
	p.q.mu.Lock()
	defer p.q.mu.Unlock()
	for _, id := range p.keys {
		ahead := false
		for _, o := range p.q.lines[id] {
			if o == p {
				break
			}
			if o.parked {
				ahead = true
				break
			}
		}
		if !ahead {
			return false
		}
	}
	return len(p.keys) > 0
}

func (p *Place) park(on bool) {
	p.q.mu.Lock()
	p.parked = on
	p.q.mu.Unlock()
}

// Wait blocks until p is woken (a slot freed on one of its keys), until
// passes, or ctx ends; only the last is an error, ctx's own.
func (p *Place) Wait(ctx context.Context, until time.Time) error {
	start := time.Now()
	p.park(true)
	defer func() {
		p.park(false)
		p.waited += time.Since(start)
	}()
	t := time.NewTimer(time.Until(until))
	defer t.Stop()
	select {
	case <-p.wake:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Waited returns the time p spent in Wait.
func (p *Place) Waited() time.Duration { return p.waited }

// Leave takes p out of line. A wake-up it held and did not take goes to
// the next caller waiting on that key. Leaving twice is harmless.
func (p *Place) Leave() {
	if p.left {
		return
	}
	p.left = true
	q := p.q
	q.mu.Lock()
	for _, id := range p.keys {
		line := slices.DeleteFunc(q.lines[id], func(o *Place) bool { return o == p })
		if len(line) == 0 {
			delete(q.lines, id)
		} else {
			q.lines[id] = line
		}
	}
	q.n--
	q.mu.Unlock()
	select {
	case id := <-p.wake:
		q.Wake(id)
	default:
	}
	if p.leave != nil {
		p.leave()
	}
}

// Retry calls try until it returns anything but a *CapacityError, or until
// passes: then it returns try's last answer, the pool full. Between tries
// it waits in p's place for a wake-up, the capacity error's FreeAt (for
// the caller first in line), or WaitPoll, whichever comes first. A caller
// behind others in line waits for its turn before its first try. If ctx
// ends while it waits, it returns ctx's error, having taken nothing.
func (p *Place) Retry(ctx context.Context, until time.Time, try func(context.Context) error) error {
	var full *CapacityError
	for wait := p.Behind(); ; wait = true {
		if wait {
			if err := p.Wait(ctx, p.next(full, until)); err != nil {
				return fmt.Errorf("optimistic: waiting for a free slot: %w", err)
			}
		}
		err := try(ctx)
		if !errors.As(err, &full) || !time.Now().Before(until) {
			return err
		}
	}
}

// next is when p asks the store again after full (nil: not asked yet):
// at WaitPoll, jittered so that callers spread out, or sooner at full's
// FreeAt if p is first in line, and never after until.
func (p *Place) next(full *CapacityError, until time.Time) time.Time {
	now := time.Now()
	at := now.Add(WaitPoll/2 + rand.N(WaitPoll/2))
	if full != nil && !full.FreeAt.IsZero() && !p.Behind() {
		at = minTime(at, full.FreeAt)
	}
	if at.Before(now.Add(minWaitStep)) {
		at = now.Add(minWaitStep)
	}
	return minTime(at, until)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// A Waiter is a LeaseStore whose callers can wait for a slot to free up:
// Allocate with AllocateRequest.Wait, or, for a caller that combines
// several requests (pool fallback), Await and Place.Retry around its own
// Allocate calls.
type Waiter interface {
	LeaseStore
	// Await joins this process's line of callers waiting on keyIDs and
	// makes sure that releases on them, by any process, wake the line.
	// The place must be left; leaving it leaves nothing behind in the
	// store.
	Await(ctx context.Context, keyIDs []string) (*Place, error)
	// Waiting returns how many callers of this store wait in line.
	Waiting() int
}
