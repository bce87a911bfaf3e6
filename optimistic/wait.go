package optimistic

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	rs "github.com/credpool/credpool/internal/redisschema"
)

var _ Waiter = (*Store)(nil)

// subscribeTimeout bounds how long Await waits for Redis to confirm a
// subscription; past it the caller waits anyway, on WaitPoll and FreeAt.
const subscribeTimeout = time.Second

// Await joins this process's line of callers waiting for a slot on keyIDs
// (see Waiter). Releases, lease clear-outs and syncs of a key, by this or
// any other process, notify the key's sharded pub/sub channel (a SPUBLISH
// to the key's own slot, so it works on Redis Cluster; a release sends it
// right after its EXEC, in the same round trip); this process listens on the channels of the keys its callers
// wait on, over connections of their own, outside the pool, and stops
// when the last of them leaves. A release in this process wakes the next
// caller at once, without the round trip, when the slot is this
// process's turn (see turns.go). A notice lost with its connection costs
// at most WaitPoll, or the time to FreeAt.
func (s *Store) Await(ctx context.Context, keyIDs []string) (*Place, error) {
	if err := CheckKeyIDs(keyIDs...); err != nil {
		return nil, err
	}
	ids := distinct(keyIDs)
	ready := s.notices.listen(ctx, s, ids)
	p := s.queue.Join(ids)
	p.leave = func() { s.notices.stop(s, ids) }
	p.unused = s.announceFree
	t := time.NewTimer(subscribeTimeout)
	defer t.Stop()
	for _, r := range ready {
		select {
		case <-r:
		case <-t.C:
			return p, nil
		case <-ctx.Done():
			p.Leave()
			return nil, Classify(ctx, "await", ctx.Err())
		}
	}
	return p, nil
}

// Waiting is the number of callers of this Store waiting for a slot.
func (s *Store) Waiting() int { return s.queue.Len() }

// AllocateWaiting is Allocate with req.Wait for a Waiter w: it joins w's
// line on req's candidates and calls allocate, an Allocate that does not
// wait, until it grants, fails otherwise than "not yet" (NotYet), or
// req.Wait passes (the last answer, full or contended, then stands). A
// release in w's process may hand it a slot meanwhile (see
// Store.Release; a store that does not, like the SQLite one, only wakes
// it). The Stats add up every call's,
// with the time waited. It is how this package's Store and the SQLite
// store wait alike.
func AllocateWaiting(ctx context.Context, w Waiter, req AllocateRequest, allocate func(context.Context, AllocateRequest) (Lease, Stats, error)) (Lease, Stats, error) {
	var st Stats
	until := time.Now().Add(req.Wait)
	req.Wait = 0
	ctx = WithWaiting(ctx)
	if w.Waiting() == 0 {
		// Nobody waits here: a free slot is taken without listening for
		// notices first. Only a caller that found no room joins the line
		// and tries again, once it listens, so that no release in between
		// goes unnoticed.
		lease, one, err := allocate(ctx, req)
		st.Add(one)
		if !NotYet(err) {
			return lease, st, err
		}
	}
	p, err := w.Await(ctx, req.Candidates)
	if err != nil {
		return Lease{}, st, err
	}
	defer p.Leave()
	p.Offer(req.Provider, req.Pool, req.TTL)
	var lease Lease
	err = p.Retry(ctx, until, func(ctx context.Context) error {
		var one Stats
		var err error
		lease, one, err = allocate(ctx, req)
		st.Add(one)
		return err
	})
	st.Waited = p.Waited()
	if h, ok := p.Handed(); ok {
		if err == nil {
			return h, st, nil
		}
		// Handed over as ctx ended: the slot goes back (or on, to the
		// next caller in line).
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), coalesceTimeout)
		defer cancel()
		_ = w.Release(rctx, h.LeaseRef)
	}
	return lease, st, err
}

// waitingKey marks the context of a caller that waits for a slot when it
// finds none (see WithWaiting).
type waitingKey struct{}

// WithWaiting returns a copy of ctx that marks every Allocate under it as
// a try of a caller that, finding no slot, waits in line for one. On a
// candidate whose turn another call of this process holds (see
// Store.Allocate), such a call takes that call's word that the candidate
// is full, if it asks for the same provider and pool, instead of waiting
// for the turn to read it again itself. AllocateWaiting and Place.Retry
// mark their tries; a caller that makes a first try of its own before
// Await, as credpool's broker does, marks that one. A caller that retries
// after "no slot" should not be marked: it does better reading for
// itself.
//
// A context value, because the tries of Place.Retry are the caller's own
// functions, which get only a ctx from it; a store of another package
// may honour the mark too (IsWaiting).
func WithWaiting(ctx context.Context) context.Context {
	if IsWaiting(ctx) {
		return ctx
	}
	return context.WithValue(ctx, waitingKey{}, true)
}

// IsWaiting reports whether ctx is marked WithWaiting.
func IsWaiting(ctx context.Context) bool {
	v, _ := ctx.Value(waitingKey{}).(bool)
	return v
}

// A free-slot notice's payload is the sending store's id, so that its own
// listener can skip it (the sender wakes its line directly), then, after a
// space, what happened: nothing for one freed slot (every listening
// process wakes its next caller), or one of these, with its argument
// after a space.
const (
	// noticeAll: several slots may have freed (a sync, a clear-out).
	noticeAll = "all"
	// noticeTo, with a store's id: one slot freed for that store's
	// callers; the others' stay asleep (see Store.turn).
	noticeTo = "to"
)

// notice is keyID's free-slot notice of what (see noticeAll).
func (s *Store) notice(keyID, what string) cmd {
	payload := s.id
	if what != "" {
		payload += " " + what
	}
	return cmd{"spublish", s.keys.Free(keyID), payload}
}

// freedFor is the notice of a slot freed on keyID for to's callers (see
// Store.turn): for every listening process's if to is "".
func (s *Store) freedFor(keyID, to string) cmd {
	if to == "" {
		return s.notice(keyID, "")
	}
	return s.notice(keyID, noticeTo+" "+to)
}

// wake hands a slot freed on keyID for this process's callers (its turn)
// to the next of them; if none can take it (none waits, or all are awake
// already) and another process may wait, every listening process is told
// instead, so that the slot is not left free unnoticed.
func (s *Store) wake(keyID string) {
	if !s.queue.wakeTurn(keyID) && !s.notices.alone(keyID) {
		s.announceFree(keyID)
	}
}

// announceFree sends keyID's notice of a slot freed for every listening
// process's callers, in the background.
func (s *Store) announceFree(keyID string) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), unwatchTimeout)
		defer cancel()
		_ = s.rdb.Do(ctx, s.notice(keyID, "")...).Err()
	}()
}

// notices is a Store's listening on the free-slot channels of the keys
// its callers wait on. It is safe for concurrent use.
type notices struct {
	mu sync.Mutex
	// shared listens for every key on one connection, when the client
	// talks to one server; else each key has its own, to the node that
	// owns the channels' slot.
	shared *redis.PubSub
	subs   map[string]*subscription
	// said holds this store's announcements not sent yet (see turns.go),
	// waits the keys with a "waits" among them.
	said   []said
	waits  map[string]bool
	saying bool
}

type subscription struct {
	waiters int
	ready   chan struct{} // closed when Redis confirmed the subscription
	ps      *redis.PubSub // what it listens on: its own, or notices.shared
	// listeners is how many connections listened on the channel, this
	// one included, as a release last heard (0: not heard yet).
	listeners int64
	// others are the other stores heard waiting for the key (see
	// turns.go); announce repeats this store's own once its Turns
	// subscription is confirmed.
	others   map[string]waiting
	announce *time.Timer
}

// heard records n listeners on keyID's channel, as a release's SPUBLISH
// or PUBSUB SHARDNUMSUB replied.
func (n *notices) heard(keyID string, listeners int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	sub := n.subs[keyID]
	if sub == nil {
		return
	}
	select {
	case <-sub.ready:
		sub.listeners = listeners
	default:
		// Not counted yet itself: the count may be another's alone.
		sub.listeners = 0
	}
}

// listen subscribes to the channels of ids not yet listened to and
// returns, per id, a channel closed once Redis confirmed it. Connections
// are dialled outside the lock, so that a server slow to answer holds up
// no other caller's listening or leaving.
func (n *notices) listen(ctx context.Context, s *Store, ids []string) []chan struct{} {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), subscribeTimeout)
	defer cancel()
	_, single := s.rdb.(*redis.Client)
	var fresh []string
	n.mu.Lock()
	if n.subs == nil {
		n.subs = make(map[string]*subscription)
	}
	out := make([]chan struct{}, len(ids))
	for i, id := range ids {
		sub := n.subs[id]
		if sub == nil {
			sub = &subscription{ready: make(chan struct{})}
			n.subs[id] = sub
			fresh = append(fresh, id)
			if single {
				if n.shared == nil {
					// No channel yet: it dials from its reader.
					n.shared = s.rdb.SSubscribe(ctx)
					go n.read(s, n.shared)
				}
				sub.ps = n.shared
			}
		}
		sub.waiters++
		out[i] = sub.ready
	}
	shared := n.shared
	n.mu.Unlock()
	for _, id := range fresh {
		chans := []string{s.keys.Free(id), s.keys.Turns(id)}
		if single {
			// An error (the connection closed meanwhile, the server down)
			// leaves the waiters to polling.
			_ = shared.SSubscribe(ctx, chans...)
			continue
		}
		// On a cluster the channels, in one slot, pick the node to dial.
		ps := s.rdb.SSubscribe(ctx, chans...)
		n.mu.Lock()
		// The caller's own waiter keeps the subscription: it leaves only
		// once this returned.
		n.subs[id].ps = ps
		n.mu.Unlock()
		go n.read(s, ps)
	}
	return out
}

// stop drops ids' waiters and unsubscribes from the channels nobody waits
// on any more, closing the connections left with none. It writes under
// the lock, so that an unsubscription goes out before a later
// subscription to the same channel.
func (n *notices) stop(s *Store, ids []string) {
	ctx, cancel := context.WithTimeout(context.Background(), unwatchTimeout)
	defer cancel()
	n.mu.Lock()
	defer n.mu.Unlock()
	var done []string
	for _, id := range ids {
		sub := n.subs[id]
		if sub.waiters--; sub.waiters > 0 {
			continue
		}
		delete(n.subs, id)
		if sub.announce != nil {
			sub.announce.Stop()
			n.say(s, id, noticeLeft)
		}
		if sub.ps != n.shared {
			_ = sub.ps.Close()
		} else {
			done = append(done, id)
		}
	}
	if n.shared == nil || len(done) == 0 {
		return
	}
	if len(n.subs) == 0 {
		_ = n.shared.Close()
		n.shared = nil
		return
	}
	chans := make([]string, 0, 2*len(done))
	for _, id := range done {
		chans = append(chans, s.keys.Free(id), s.keys.Turns(id))
	}
	_ = n.shared.SUnsubscribe(ctx, chans...)
}

// read acts on each message ps receives from another store, free-slot
// notices (see noticeAll) and announcements (see turns.go), and marks ps's
// subscriptions confirmed, until ps is closed.
func (n *notices) read(s *Store, ps *redis.PubSub) {
	for m := range ps.ChannelWithSubscriptions() {
		switch m := m.(type) {
		case *redis.Message:
			id, ok := rs.FreeKeyID(m.Channel)
			from, what, _ := strings.Cut(m.Payload, " ")
			what, arg, _ := strings.Cut(what, " ")
			switch {
			case !ok:
			case rs.IsTurns(m.Channel):
				if from != s.id {
					n.heardOf(s, id, from, what, arg)
				}
			case from == s.id:
			case what == noticeAll:
				s.notes.freed(id)
				s.queue.WakeAll(id)
			case what == noticeTo && arg != "":
				s.notes.freed(id)
				if arg == s.id {
					s.wake(id)
				} else {
					n.turnTo(id, arg)
				}
			default:
				s.notes.freed(id)
				s.queue.Wake(id)
			}
		case *redis.Subscription:
			if id, ok := rs.FreeKeyID(m.Channel); ok && m.Kind == "ssubscribe" {
				n.confirm(s, id, ps, rs.IsTurns(m.Channel))
			}
		}
	}
}

// confirm marks id's subscription on ps confirmed: its Free channel, which
// waiters wait for, or its Turns channel, once confirmed this store says
// that its callers wait (see turns.go). A subscription on another
// connection (made again since) waits for its own confirmation.
func (n *notices) confirm(s *Store, id string, ps *redis.PubSub, turns bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	sub := n.subs[id]
	switch {
	case sub == nil || sub.ps != ps:
	case !turns:
		select {
		case <-sub.ready:
		default:
			close(sub.ready)
		}
	case sub.announce == nil:
		n.say(s, id, noticeHello)
		sub.announce = time.AfterFunc(s.announceEvery, func() { n.announce(s, id, sub) })
	}
}
