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

// WaitPoll bounds how long a caller in line goes without asking the
// store again: a wake-up that never came (a notice lost with its
// connection, a release in another process of a store that cannot
// notify, a turn given to a process that had just stopped listening and
// not passed on) costs at most about this long.
const WaitPoll = time.Second

// minWaitStep keeps a caller told "frees up now" (a FreeAt in the past by
// this host's clock) from spinning on the store.
const minWaitStep = 2 * time.Millisecond

// Queue lines up this process's callers that wait for a free slot, per
// key, in arrival order. A slot freed on a key wakes the earliest caller
// waiting on it that is not already awake, so callers that found the key
// full are served in turn, and one release wakes one caller, not a herd.
// (A caller that arrives while nobody in line has found its keys full
// tries at once, as everyone may until the slots are taken.) The zero Queue is ready to
// use; it is safe for concurrent use. Nothing of it lives outside this
// process.
type Queue struct {
	mu    sync.Mutex
	lines map[string][]*Place // by key id, in arrival order
	n     int                 // places in line
}

// Place is one caller's place in a Queue, on the keys it waits for. It is
// used by one goroutine (Wait, Retry, Leave); the Queue wakes it, and End
// ends it, from any.
type Place struct {
	q    *Queue
	keys []string
	// wake holds the key of a wake-up not yet taken: one at most, a
	// second goes to the next caller in line.
	wake chan string
	// parked says p waits in Wait: it found no slot, or waits for its
	// turn. Guarded by q.mu.
	parked bool
	// offer, when set, lets a release in this process hand p its slot
	// (see handoff). Replaced only by p's goroutine, under q.mu.
	offer  *handoff
	joined time.Time
	handed *Lease // a slot handed to p, once it took it
	leave  func()
	// turn is the key of the wake-up p holds if it is a turn (see
	// WakeTurn); guarded by q.mu. owed is the key of a turn p took and has
	// not tried the store since, unseen that of a plain wake-up; used by
	// p's goroutine. Leave hands either on: a caller that took a wake-up
	// and left without a try that saw the store (its wait ran out, or its
	// try failed otherwise than "no slot") must not keep the slot from
	// the next caller.
	turn, owed, unseen string
	// unused, if set, gets the key of a turn p took or held and did not
	// use, when no other caller here could take it (none waits, or all
	// are awake already): the slot may be free with no other process
	// told (see Store.turn).
	unused func(keyID string)
	left   bool
	waited time.Duration
	// ended is closed by End, which sets cause first (once: endOnce).
	ended   chan struct{}
	cause   error
	endOnce sync.Once
}

// A handoff is a waiting caller's request that a release on one of its
// keys may grant in its own MULTI (see Store.Release): the slot goes from
// the releasing holder to the caller without ever being free.
type handoff struct {
	provider, pool string
	ttl            time.Duration
	claimed        bool // by a release; guarded by Queue.mu
	// missed is the key of a wake-up that passed the caller over while
	// claimed and woke nobody (turn if it was a turn): the caller hands
	// it on once served, to whoever lined up behind it meanwhile.
	// Guarded by Queue.mu.
	missed string
	turn   bool
	// done is closed once the release that claimed it settled it: lease
	// is the caller's if ok, else the caller tries the store itself.
	done  chan struct{}
	lease Lease
	ok    bool
}

func newHandoff(provider, pool string, ttl time.Duration) *handoff {
	return &handoff{provider: provider, pool: pool, ttl: ttl, done: make(chan struct{})}
}

// settle hands h its outcome.
func (h *handoff) settle(lease Lease, ok bool) {
	h.lease, h.ok = lease, ok
	close(h.done)
}

// Join puts a new place at the end of the line of each of keyIDs. The
// place must be left (Leave).
func (q *Queue) Join(keyIDs []string) *Place {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.lines == nil {
		q.lines = make(map[string][]*Place)
	}
	p := &Place{q: q, keys: distinct(keyIDs), wake: make(chan string, 1), joined: time.Now(), ended: make(chan struct{})}
	for _, id := range p.keys {
		q.lines[id] = append(q.lines[id], p)
	}
	q.n++
	return p
}

// Wake hands a freed slot on keyID to the earliest caller waiting on it
// that holds no wake-up yet and is not being handed a slot (see handoff).
// With none, if callers in line are being handed slots, the first of them
// passes the wake-up on once served, to whoever lined up behind it by
// then; else it does nothing (callers that are trying the store right
// now see the slot themselves). It reports whether it woke a caller or
// left the wake-up so.
func (q *Queue) Wake(keyID string) bool { return q.wake(keyID, false, nil) }

// WakeOthers is Wake for a slot that a grant under ctx found free besides
// the one it took (an expired lease it pruned). If ctx is a try of
// Place.Retry, that caller's own place is skipped: the grant served it,
// and a wake-up it took would reach the line only once it left.
func (q *Queue) WakeOthers(ctx context.Context, keyID string) bool {
	return q.wake(keyID, false, placeOf(ctx))
}

// wakeTurn is Wake for a slot freed for this process's callers alone (a
// turn, see Store.turn): a caller that takes it and leaves, or ends its
// wait, without trying the store hands it on, to the next caller here or
// to Place's unused.
func (q *Queue) wakeTurn(keyID string) bool { return q.wake(keyID, true, nil) }

// wake is Wake, or wakeTurn if turn, passing over skip (nil: nobody).
func (q *Queue) wake(keyID string, turn bool, skip *Place) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	var served *handoff
	for _, p := range q.lines[keyID] {
		if p == skip {
			continue
		}
		if p.offer != nil && p.offer.claimed {
			// A release is handing it a slot.
			if served == nil {
				served = p.offer
			}
			continue
		}
		select {
		case p.wake <- keyID:
			if turn {
				p.turn = keyID
			}
			return true
		default:
		}
	}
	if served != nil && served.missed == "" {
		// Nobody else to wake: the caller being served passes it on to
		// whoever lines up behind it by then (see Place.wait).
		served.missed, served.turn = keyID, turn
		return true
	}
	return false
}

// claim takes the handoff of the earliest caller waiting on keyID, parked
// and holding no wake-up, that asks for provider and pool: a release of
// such a lease may grant it (see Store.Release). It returns nil when there
// is none. The caller must settle what it claimed.
func (q *Queue) claim(keyID, provider, pool string) *handoff {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, p := range q.lines[keyID] {
		h := p.offer
		if p.parked && len(p.wake) == 0 && h != nil && !h.claimed && h.provider == provider && h.pool == pool {
			h.claimed = true
			return h
		}
	}
	return nil
}

// WakeAll wakes every caller waiting on keyID: an event that may have
// freed several slots at once (a raised limit, a clear-out).
func (q *Queue) WakeAll(keyID string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, p := range q.lines[keyID] {
		select {
		case p.wake <- keyID:
		default:
		}
	}
}

// oldest returns how long the earliest caller parked on keyID has waited,
// if one is: one that holds a wake-up, or is being handed a slot, is
// served already, and one trying the store is not waiting.
func (q *Queue) oldest(keyID string) (time.Duration, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, p := range q.lines[keyID] {
		if p.parked && len(p.wake) == 0 && (p.offer == nil || !p.offer.claimed) {
			return time.Since(p.joined), true
		}
	}
	return 0, false
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

// Wait blocks until p is woken (a slot freed on one of its keys), until
// passes, p is ended (End), or ctx ends; only the last two are errors,
// ctx's own, or End's cause. After Offer, a release may have handed p a
// slot meanwhile: Handed has it, and the caller holds it.
func (p *Place) Wait(ctx context.Context, until time.Time) error {
	err := p.wait(ctx, until)
	if err == nil {
		err = p.endedBy()
	}
	return err
}

// wait is Wait but for End's cause. A release that claimed p's
// handoff meanwhile is waited for, however p's wait ended: its slot, if
// handed, is then p's (Handed), and a wake-up p took meanwhile goes to
// the next caller.
func (p *Place) wait(ctx context.Context, until time.Time) (err error) {
	start := time.Now()
	defer func() { p.waited += time.Since(start) }()
	p.q.mu.Lock()
	p.parked = true
	p.q.mu.Unlock()
	t := time.NewTimer(time.Until(until))
	defer t.Stop()
	var (
		handed <-chan struct{}
		wakeID string // the key p was woken for, "" if not woken
	)
	if p.offer != nil {
		handed = p.offer.done
	}
	select {
	case wakeID = <-p.wake:
	case <-handed:
	case <-t.C:
	case <-p.ended:
	case <-ctx.Done():
		err = ctx.Err()
	}
	p.q.mu.Lock()
	p.parked = false
	switch {
	case wakeID == "":
	case p.turn == wakeID:
		p.owed, p.turn = wakeID, ""
	default:
		p.unseen, p.turn = wakeID, ""
	}
	h := p.offer
	claimed := h != nil && h.claimed
	if claimed {
		p.offer = newHandoff(h.provider, h.pool, h.ttl)
	}
	p.q.mu.Unlock()
	if !claimed {
		return err
	}
	// Settled within the release's bounds: its pipeline (coalesceTimeout,
	// after those queued before it) and, if refused, the give-back
	// (unwatchTimeout).
	<-h.done
	p.q.mu.Lock()
	missed, turn := h.missed, h.turn
	p.q.mu.Unlock()
	if missed != "" && !p.q.wake(missed, turn, p) && turn && p.unused != nil {
		p.unused(missed)
	}
	if !h.ok {
		// Not granted: p tries the store itself.
		return err
	}
	p.handed = &h.lease
	if wakeID != "" {
		p.handOn(wakeID)
	}
	return err
}

// Offer lets a release of a lease of provider and pool in this process
// hand p its slot, as a lease of ttl, while p waits in Retry (see
// Store.Release): Retry then returns, and Handed has the lease. A store
// that hands nothing over (the SQLite one) only wakes p.
func (p *Place) Offer(provider, pool string, ttl time.Duration) {
	p.q.mu.Lock()
	defer p.q.mu.Unlock()
	p.offer = newHandoff(provider, pool, ttl)
}

// Handed returns the lease a release handed p (see Offer), if it did
// since the last call, and forgets it: the caller holds it, to use or
// release, whatever Retry returned.
func (p *Place) Handed() (Lease, bool) {
	h := p.handed
	p.handed = nil
	if h == nil {
		return Lease{}, false
	}
	return *h, true
}

// End ends p's wait for good, from any goroutine: Retry returns an error
// wrapping cause instead of waiting again, at once if it waits, else once
// its try in progress answers "not now". What that try grants, and a slot
// a release already claimed p's handoff for (see Offer), are still the
// caller's, so ending takes nothing from the store and loses no slot.
// Only the first call's cause counts.
func (p *Place) End(cause error) {
	p.endOnce.Do(func() {
		p.cause = cause
		close(p.ended)
	})
}

// endedBy returns End's cause, or nil if p was not ended.
func (p *Place) endedBy() error {
	select {
	case <-p.ended:
		return p.cause
	default:
		return nil
	}
}

// Waited returns the time p spent in Wait.
func (p *Place) Waited() time.Duration { return p.waited }

// handOn passes on a wake-up on keyID that p took and will not use: to
// the next caller here, and a turn no caller here can take to unused.
func (p *Place) handOn(keyID string) {
	turn := p.owed == keyID
	if turn {
		p.owed = ""
	}
	if p.unseen == keyID {
		p.unseen = ""
	}
	if !p.q.wake(keyID, turn, nil) && turn && p.unused != nil {
		p.unused(keyID)
	}
}

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
	var held string
	select {
	case held = <-p.wake:
	default:
	}
	turn := held != "" && p.turn == held
	p.turn = ""
	q.mu.Unlock()
	// A turn held goes on as a turn, besides one owed (two slots).
	if held != "" && !q.wake(held, turn, nil) && turn && p.unused != nil {
		p.unused(held)
	}
	if p.owed != "" {
		p.handOn(p.owed)
	}
	if p.unseen != "" {
		p.handOn(p.unseen)
	}
	if p.leave != nil {
		p.leave()
	}
}

// Retry calls try until it returns anything but "not now" (a
// *CapacityError, or ErrContended: a hot key, busy with other processes),
// or until passes: then it returns try's last answer; or until a release
// hands p a slot (see Offer): then it returns nil, or ctx's error if ctx
// ended meanwhile, and the slot is the caller's (Handed). Between tries it
// waits in p's place for a wake-up, the capacity error's FreeAt (for the
// caller first in line), or WaitPoll, whichever comes first. try's ctx
// is marked WithWaiting and carries p, so that a grant under it wakes
// others in line, not p, for the slots it found free besides its own
// (see Queue.WakeOthers). No try starts after until, so a caller that
// bounds its work at until plus one try's time gets the answer, not its
// own deadline. A caller behind others in line waits for its turn (or
// its poll) before its first try, and tries once even if until passed
// meanwhile. If ctx ends while it waits, it returns ctx's
// error, having taken nothing but a slot handed over meanwhile. Once p
// is ended (End) it waits no more: it returns End's cause, having taken
// nothing, or nil for a slot handed over meanwhile; a try in progress is
// not cut short.
func (p *Place) Retry(ctx context.Context, until time.Time, try func(context.Context) error) error {
	var (
		full *CapacityError
		last error
	)
	ctx = context.WithValue(WithWaiting(ctx), placeKey{}, p)
	// An ended place tries once, behind others or not, and then waits no
	// more.
	for wait := p.Behind() && p.endedBy() == nil; ; wait = true {
		if wait {
			if cause := p.endedBy(); cause != nil {
				return fmt.Errorf("optimistic: waiting for a free slot: %w", cause)
			}
			err := p.wait(ctx, p.next(full, until))
			if err != nil {
				return fmt.Errorf("optimistic: waiting for a free slot: %w", err)
			}
			if p.handed != nil {
				return nil
			}
			if cause := p.endedBy(); cause != nil {
				return fmt.Errorf("optimistic: waiting for a free slot: %w", cause)
			}
			if last != nil && !time.Now().Before(until) {
				return last
			}
		}
		err := try(ctx)
		if err == nil || NotYet(err) {
			// The store was seen after any wake-up taken: its slot is
			// taken, by this caller or another.
			p.owed, p.unseen = "", ""
		}
		if !NotYet(err) || !time.Now().Before(until) {
			return err
		}
		errors.As(err, &full)
		last = err
	}
}

// placeKey marks the context of a try of Place.Retry with its place.
type placeKey struct{}

// placeOf returns the place whose try ctx is (see Place.Retry), or nil.
func placeOf(ctx context.Context) *Place {
	p, _ := ctx.Value(placeKey{}).(*Place)
	return p
}

// NotYet reports whether err says "no slot now, perhaps soon": no free
// slot (ErrNoCapacity), or a key too busy with other processes to take
// one (ErrContended). A waiting caller waits on; others may retry later.
func NotYet(err error) bool {
	return errors.Is(err, ErrNoCapacity) || errors.Is(err, ErrContended)
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
