package optimistic

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Turns across processes. A release in a process whose callers wait for
// the key can hand its slot to the first of them in one round trip (see
// handoff), but that keeps the slot in the process: while callers of other
// processes wait too, the processes take turns. Each store that waits for
// a key says so on the key's Turns channel, with how long its
// longest-waiting caller has waited (of those parked in line: not one
// woken, being handed a slot or trying; none if none is): "hello" when it
// subscribes (every store already waiting answers "waits", so the newcomer
// knows them at once), "waits" every announceEvery, "left" when it stops.
// A release keeps its slot (a handoff, or a wake-up here) unless another
// store's longest-waiting caller, as it said plus the time since, has
// waited turnSlack longer than this store's own (or this one has none
// waiting); then it frees the slot and its notice names that store ("to"):
// only that store wakes a caller, and the releasing store and every store
// that hears the notice count it as just served until it speaks again, so
// that the releases of several processes do not all pick the same line.
// So a slot stays in a process for runs of one-round-trip handoffs, no
// process's line falls further behind than turnSlack plus an
// announcement's lag, and a freed slot is tried by one process instead of
// raced for by all.
//
// While somebody listens who has not announced itself, or nobody was
// heard but this store does not listen alone, a release frees its slot
// for every listener (a plain notice), as does a release in a process
// with no caller waiting for the key.
//
// A turn can miss: the store named may have stopped listening before the
// notice came (its "left" not heard yet), or find its callers all awake
// already, or the caller it wakes may leave or end its wait without trying
// the store, or try and fail otherwise than "full". The first shows in the
// notice's reply (other than the listeners it counted on), the others to
// the store named; each time every listener is then told, as after a plain
// release. A store that stopped announcing (gone, cut off) is given no
// turn after heardWithin, however often it was named. What is left is
// bounded by the callers' poll (WaitPoll, FreeAt): a caller woken for one
// key that took a slot of another of its keys, and processes of a version
// before turns.

// announceEvery is how often a store says again that its callers wait for
// a key (noticeWaits): Store.announceEvery. On a hot key a line's wait
// changes many times within 100 ms; announced that rarely, the releases
// of all processes kept giving their slots to lines served meanwhile, and
// the slots went round in bursts (README, "Across processes").
const announceEvery = 25 * time.Millisecond

// heardWithin is how recently a store must have announced itself to be
// given a turn: a few announcements, so that a store whose announcement
// a busy machine delays is not dropped at once: Store.heardWithin.
const heardWithin = 200 * time.Millisecond

// turnSlack is by how much another process's longest-waiting caller must
// have waited longer than this process's own for a slot freed here to go
// to it: Store.turnSlack.
const turnSlack = 50 * time.Millisecond

// The announcements on a key's Turns channel: the sending store's id, a
// space, one of these, and for hello and waits a space and how long its
// longest-waiting caller has waited, in milliseconds.
const (
	noticeHello = "hello"
	noticeWaits = "waits"
	noticeLeft  = "left"
)

// maxWaited bounds an announced wait, which only a garbled or hostile
// payload could exceed.
const maxWaited = time.Hour

// waiting is what a store last said of its callers waiting for a key,
// heard at heard: its longest-waiting one had waited age, or none waited.
// served is when a release here last gave it a turn, or a notice heard
// here named it.
type waiting struct {
	heard, served time.Time
	age           time.Duration
	none          bool
}

// waited is how long the store's longest-waiting caller has waited by
// now, as far as this store knows: since it was last given a turn, if
// that came after it spoke.
func (w waiting) waited() time.Duration {
	if w.served.After(w.heard) {
		return time.Since(w.served)
	}
	return w.age + time.Since(w.heard)
}

// said is an announcement not sent yet: what, on keyID's Turns channel.
type said struct{ keyID, what string }

// turn says whose callers a slot freed on keyID goes to (see above): ""
// for every listening process's, this store's id, or another's. For
// another, expect is how many listeners the notice should reach: each
// store counted on, and this one once its subscription is confirmed.
// While somebody listens who has not announced itself (as the last
// release heard the listeners), or nobody else was heard but this store
// does not listen alone, it is "": a turn could pass it by.
func (s *Store) turn(keyID string) (to string, expect int64) {
	n := &s.notices
	n.mu.Lock()
	defer n.mu.Unlock()
	sub := n.subs[keyID]
	if sub == nil {
		return "", 0
	}
	var (
		oldest string
		age    time.Duration
		heard  int64
	)
	for id, w := range sub.others {
		if time.Since(w.heard) >= s.heardWithin {
			delete(sub.others, id)
			continue
		}
		heard++
		if a := w.waited(); !w.none && (oldest == "" || a > age) {
			oldest, age = id, a
		}
	}
	select {
	case <-sub.ready:
		expect = heard + 1
	default:
		expect = heard
	}
	switch {
	case sub.listeners > heard+1, heard == 0 && sub.listeners != 1:
		return "", 0
	case oldest == "":
		return s.id, 0
	}
	if own, ok := s.queue.oldest(keyID); ok && age < own+s.turnSlack {
		return s.id, 0
	}
	sub.serve(oldest)
	return oldest, expect
}

// serve marks store, if heard waiting for sub's key, as just given a turn.
func (sub *subscription) serve(store string) {
	if w, ok := sub.others[store]; ok {
		w.served = time.Now()
		sub.others[store] = w
	}
}

// turnTo notes that another release gave store a turn on keyID: it
// counts as just served here too, so that the releases of every process
// do not all give their slots to the same store at once.
func (n *notices) turnTo(keyID, store string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if sub := n.subs[keyID]; sub != nil {
		sub.serve(store)
	}
}

// alone reports whether this store listens for keyID's notices and no
// other does, as far as it knows: the last release heard one listener,
// and no other store was heard since.
func (n *notices) alone(keyID string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	sub := n.subs[keyID]
	return sub != nil && sub.listeners == 1 && len(sub.others) == 0
}

// heardOf records what store said of its callers waiting for keyID
// (noticeHello or noticeWaits, with their longest wait in ms, or none if
// ms is empty: its callers are all trying or being served), or forgets
// them (noticeLeft). A hello is answered while this store announces.
func (n *notices) heardOf(s *Store, keyID, store, what, ms string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	sub := n.subs[keyID]
	if sub == nil {
		return
	}
	switch what {
	case noticeLeft:
		delete(sub.others, store)
	case noticeHello, noticeWaits:
		if sub.others == nil {
			sub.others = make(map[string]waiting)
		}
		v, _ := strconv.ParseInt(ms, 10, 64)
		age := time.Duration(min(max(v, 0), maxWaited.Milliseconds())) * time.Millisecond
		sub.others[store] = waiting{heard: time.Now(), served: sub.others[store].served, age: age, none: ms == ""}
		if what == noticeHello && sub.announce != nil {
			n.say(s, keyID, noticeWaits)
		}
	}
}

// announce says again that this store's callers wait for keyID, every
// announceEvery while sub is keyID's subscription.
func (n *notices) announce(s *Store, keyID string, sub *subscription) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.subs[keyID] == sub {
		n.say(s, keyID, noticeWaits)
		sub.announce.Reset(s.announceEvery)
	}
}

// say queues announcement what on keyID's Turns channel, after those
// queued before it (so a "left" never overtakes the next "hello"); a
// "waits" already queued for keyID stands for a second one. n.mu must be
// held.
func (n *notices) say(s *Store, keyID, what string) {
	if what == noticeWaits {
		if n.waits[keyID] {
			return
		}
		if n.waits == nil {
			n.waits = make(map[string]bool)
		}
		n.waits[keyID] = true
	}
	n.said = append(n.said, said{keyID, what})
	if !n.saying {
		n.saying = true
		go n.send(s)
	}
}

// send sends the queued announcements, all that are queued in one
// pipeline, until none is left. The waits they give are read as they go.
// It may run while the caller closes its client: through a client that
// routes commands itself (a Ring), whose pipeline panics if the Ring
// closes meanwhile (go-redis v9.23 reads its shards without checking),
// each announcement goes alone, and fails quietly once it is closed.
func (n *notices) send(s *Store) {
	for {
		n.mu.Lock()
		batch := n.said
		n.said = nil
		clear(n.waits)
		if len(batch) == 0 {
			n.saying = false
			n.mu.Unlock()
			return
		}
		n.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), unwatchTimeout)
		do, pipe := s.rdb.Do, redis.Pipeliner(nil)
		if _, ring := s.rdb.(*redis.Ring); !ring {
			pipe = s.rdb.Pipeline()
			do = pipe.Do
		}
		for _, a := range batch {
			payload := s.id + " " + a.what
			if age, ok := s.queue.oldest(a.keyID); ok && a.what != noticeLeft {
				payload += " " + strconv.FormatInt(age.Milliseconds(), 10)
			}
			do(ctx, "spublish", s.keys.Turns(a.keyID), payload)
		}
		if pipe != nil {
			_, _ = pipe.Exec(ctx)
		}
		cancel()
	}
}
