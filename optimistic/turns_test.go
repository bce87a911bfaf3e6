package optimistic

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/test/redistest"
)

// turnStores returns three stores on one redis-server (or one-node
// cluster) sharing key k of limit 1, which announce only when they begin
// to wait (and answer those who do): no repeated "waits" to blur a test,
// and forget only those not heard from for two hours.
func turnStores(t *testing.T, cluster bool) (a, b, c *Store) {
	t.Helper()
	a, b = waitStores(t, cluster)
	if cluster {
		c = storeOn(t, redis.NewClusterClient(&redis.ClusterOptions{Addrs: a.rdb.(*redis.ClusterClient).Options().Addrs}))
	} else {
		c = storeOn(t, redis.NewClient(&redis.Options{Addr: a.rdb.(*redis.Client).Options().Addr}))
	}
	for _, s := range []*Store{a, b, c} {
		s.announceEvery, s.heardWithin = time.Hour, 2*time.Hour
	}
	return a, b, c
}

// place joins s's line on k without trying the store: it neither polls
// nor takes a slot, so only a wake-up fills its wake channel.
func place(t *testing.T, s *Store) *Place {
	t.Helper()
	p, err := s.Await(t.Context(), []string{"k"})
	require.NoError(t, err)
	t.Cleanup(p.Leave)
	return p
}

// knows reports whether s heard of store id waiting for k.
func knows(s *Store, id string) bool {
	s.notices.mu.Lock()
	defer s.notices.mu.Unlock()
	sub := s.notices.subs["k"]
	if sub == nil {
		return false
	}
	_, ok := sub.others[id]
	return ok
}

// heardAs sets what s last heard of the other stores' callers waiting for
// k: their longest waits, heard just now.
func heardAs(s *Store, ages map[string]time.Duration) {
	s.notices.mu.Lock()
	defer s.notices.mu.Unlock()
	sub := s.notices.subs["k"]
	sub.others = make(map[string]waiting)
	for id, age := range ages {
		sub.others[id] = waiting{heard: time.Now(), age: age}
	}
}

// drained waits until every store in ss has read every message sent on
// k's channels before this call (a marker announcement, heard by all).
func drained(t *testing.T, ss ...*Store) {
	t.Helper()
	marker := "marker-" + time.Now().Format("150405.000000000")
	require.NoError(t, ss[0].rdb.Do(t.Context(), "spublish", ss[0].keys.Turns("k"), marker+" waits 0").Err())
	require.Eventually(t, func() bool {
		for _, s := range ss {
			if !knows(s, marker) {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond)
	for _, s := range ss {
		s.notices.mu.Lock()
		if sub := s.notices.subs["k"]; sub != nil {
			delete(sub.others, marker)
		}
		s.notices.mu.Unlock()
	}
}

// settled waits until the stores in ss have heard every announcement and
// answered them, and heard the answers: none comes late to overwrite
// what a test sets with heardAs.
func settled(t *testing.T, ss ...*Store) {
	t.Helper()
	drained(t, ss...)
	require.Eventually(t, func() bool {
		for _, s := range ss {
			s.notices.mu.Lock()
			busy := s.notices.saying
			s.notices.mu.Unlock()
			if busy {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond)
	drained(t, ss...)
}

// parkIn makes p wait in line, parked, until the test ends or it is woken.
func parkIn(t *testing.T, s *Store, p *Place) {
	t.Helper()
	n := parked(s)
	go func() { _ = p.Wait(t.Context(), time.Now().Add(time.Minute)) }()
	require.Eventually(t, func() bool { return parked(s) == n+1 }, 10*time.Second, time.Millisecond)
}

// Stores that wait for a key learn of each other at once: a newcomer's
// hello is answered. One that stops waiting says so and is forgotten.
// On Redis Cluster too, where each key has a connection of its own.
func TestStoresLearnWhoWaits(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		a, b, _ := turnStores(t, cluster)
		place(t, a)
		pb := place(t, b)
		require.Eventually(t, func() bool { return knows(a, b.id) && knows(b, a.id) }, 10*time.Second, time.Millisecond, "cluster %v", cluster)
		pb.Leave()
		require.Eventually(t, func() bool { return !knows(a, b.id) }, 10*time.Second, time.Millisecond, "cluster %v", cluster)
	}
}

// While callers of three processes wait, a release keeps its slot for
// its own line (handed over) while no other line is further behind, and
// else frees it for the store whose caller waited longest: only that
// store wakes a caller, and every store counts it as just served.
func TestReleasesTakeTurnsAcrossProcesses(t *testing.T) {
	a, b, c := turnStores(t, false)
	ctx := t.Context()
	a.fenceFresh = time.Minute
	// A first release: a knows the store's clock.
	l, _, err := a.Allocate(ctx, waitReq(0))
	require.NoError(t, err)
	require.NoError(t, a.Release(ctx, l.LeaseRef))
	held, _, err := a.Allocate(ctx, waitReq(0))
	require.NoError(t, err)

	pb, pc := place(t, b), place(t, c)
	pa := place(t, a)
	pa.Offer("openai", "default", time.Minute)
	waited := make(chan error, 1)
	go func() { waited <- pa.Wait(ctx, time.Now().Add(time.Minute)) }()
	next := place(t, a)
	parkIn(t, c, place(t, c))
	require.Eventually(t, func() bool { return parked(a) == 1 && knows(a, b.id) && knows(a, c.id) && knows(c, b.id) }, 10*time.Second, time.Millisecond)
	settled(t, a, b, c)

	heardAs(a, map[string]time.Duration{b.id: 0, c.id: 0})
	require.NoError(t, a.Release(ctx, held.LeaseRef))
	require.NoError(t, <-waited)
	got, ok := pa.Handed()
	require.True(t, ok, "a's own turn: handed over")
	pa.Leave()

	heardAs(a, map[string]time.Duration{b.id: time.Hour, c.id: time.Minute})
	heardAs(c, map[string]time.Duration{b.id: time.Hour, a.id: 0})
	to, _ := c.turn("k")
	require.Equal(t, b.id, to, "c would give b a turn too")
	heardAs(c, map[string]time.Duration{b.id: time.Hour, a.id: 0})
	require.NoError(t, a.Release(ctx, got.LeaseRef))
	require.Eventually(t, func() bool { return len(pb.wake) == 1 }, 10*time.Second, time.Millisecond, "b's turn")
	drained(t, a, c)
	require.Empty(t, pc.wake, "c's caller sleeps")
	require.Equal(t, 1, parked(c), "c's other caller sleeps")
	require.Empty(t, next.wake, "a's caller sleeps")
	to, _ = a.turn("k")
	require.Equal(t, c.id, to, "b counts as just served: c's turn next")
	to, _ = c.turn("k")
	require.Equal(t, c.id, to, "c heard a give b its turn: b counts as just served there too")
}

// A turn that the store named cannot use goes to every listening store,
// as a plain release's slot would, not left free until a poll: when its
// callers are all awake already, when it stopped listening before the
// notice came, and when its woken caller leaves without trying.
func TestMissedTurnIsPassedOn(t *testing.T) {
	for _, c := range []struct {
		name string
		// miss makes b miss the turn a is about to give it.
		miss func(t *testing.T, a, b *Store, pb *Place)
		// after runs once the turn was given.
		after func(t *testing.T, pb *Place)
	}{
		{"all awake", func(t *testing.T, _, b *Store, _ *Place) {
			require.True(t, b.queue.Wake("k"))
		}, nil},
		{"stopped listening", func(t *testing.T, a, b *Store, pb *Place) {
			pb.Leave()
			require.Eventually(t, func() bool { return !knows(a, b.id) }, 10*time.Second, time.Millisecond)
		}, nil},
		{"woken caller left", nil, func(t *testing.T, pb *Place) {
			require.Eventually(t, func() bool { return len(pb.wake) == 1 }, 10*time.Second, time.Millisecond)
			pb.Leave()
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b, cs := turnStores(t, false)
			ctx := t.Context()
			held, _, err := a.Allocate(ctx, waitReq(0))
			require.NoError(t, err)
			pb, pc := place(t, b), place(t, cs)
			place(t, a)
			require.Eventually(t, func() bool { return knows(a, b.id) && knows(a, cs.id) }, 10*time.Second, time.Millisecond)
			settled(t, a, b, cs)
			if c.miss != nil {
				c.miss(t, a, b, pb)
			}
			heardAs(a, map[string]time.Duration{b.id: time.Minute, cs.id: 0})
			require.NoError(t, a.Release(ctx, held.LeaseRef))
			if c.after != nil {
				c.after(t, pb)
			}
			require.Eventually(t, func() bool { return len(pc.wake) == 1 }, 10*time.Second, time.Millisecond, "c is told")
		})
	}
}

// Whose turn a freed slot is, from what the store heard: its own unless
// another's longest-waiting caller (as said, plus the time since) waited
// turnSlack longer, or none of its own waits, parked; a store given the
// turn counts as just served, yet is dropped once not heard from for
// heardWithin; a store that says none of its callers waits gets no
// turn; and while somebody listens unannounced, or nobody was heard but
// the store does not listen alone, every listener is told.
func TestTurnGoesToTheLongestWaiting(t *testing.T) {
	a, _, _ := turnStores(t, false)
	set := func(listeners int64, others map[string]waiting) {
		a.notices.mu.Lock()
		defer a.notices.mu.Unlock()
		sub := a.notices.subs["k"]
		sub.listeners, sub.others = listeners, others
	}
	pa := place(t, a)
	set(1, nil)
	require.True(t, a.notices.alone("k"), "one listener heard, no other store")
	set(2, nil)
	require.False(t, a.notices.alone("k"), "another listener")
	set(1, map[string]waiting{"b": {heard: time.Now()}})
	require.False(t, a.notices.alone("k"), "another store heard since")
	set(2, map[string]waiting{"b": {heard: time.Now()}})
	to, expect := a.turn("k")
	require.Equal(t, "b", to, "a's caller is not parked: it is trying")
	require.EqualValues(t, 2, expect, "a and b listen")
	parkIn(t, a, pa)
	now := time.Now()
	for _, c := range []struct {
		name      string
		listeners int64
		b         waiting
		to        string
	}{
		{"b's caller waited far longer", 2, waiting{heard: now, age: time.Minute}, "b"},
		{"b's caller waited since it was heard", 2, waiting{heard: now.Add(-time.Minute)}, "b"},
		{"a's caller waited longer", 2, waiting{heard: now}, a.id},
		{"b was served since it spoke", 2, waiting{heard: now, age: time.Minute, served: now.Add(time.Millisecond)}, a.id},
		{"none of b's callers waits", 2, waiting{heard: now, age: time.Minute, none: true}, a.id},
		{"b not heard from lately, though served", 1, waiting{heard: now.Add(-3 * time.Hour), age: time.Minute, served: now}, a.id},
		{"b not heard from lately, and a not alone", 2, waiting{heard: now.Add(-3 * time.Hour)}, ""},
		{"an unannounced listener", 3, waiting{heard: now, age: time.Minute}, ""},
	} {
		set(c.listeners, map[string]waiting{"b": c.b})
		to, expect = a.turn("k")
		require.Equal(t, c.to, to, c.name)
		if to == "b" {
			require.EqualValues(t, 2, expect, "a and b listen")
			to, _ = a.turn("k")
			require.Equal(t, a.id, to, "b was just served")
		}
	}
	pa.Leave()
	to, _ = a.turn("k")
	require.Empty(t, to, "nobody waits here")
}

// A turn that a caller took and did not use (its try failed otherwise
// than "full") goes to every listening store when it leaves.
func TestTurnNotTriedIsPassedOn(t *testing.T) {
	a, b, c := turnStores(t, false)
	ctx := t.Context()
	held, _, err := a.Allocate(ctx, waitReq(0))
	require.NoError(t, err)
	pc := place(t, c)
	place(t, a)
	pb := place(t, b)
	down := errors.New("store down")
	done := make(chan error, 1)
	go func() {
		done <- pb.Retry(ctx, time.Now().Add(time.Minute), func(context.Context) error {
			if pb.owed == "k" {
				return down
			}
			return &CapacityError{}
		})
	}()
	require.Eventually(t, func() bool { return parked(b) == 1 && knows(a, b.id) && knows(a, c.id) }, 10*time.Second, time.Millisecond)
	settled(t, a, b, c)
	heardAs(a, map[string]time.Duration{b.id: time.Hour, c.id: 0})
	require.NoError(t, a.Release(ctx, held.LeaseRef))
	require.ErrorIs(t, <-done, down)
	require.Empty(t, pc.wake, "c's caller sleeps: the turn was b's")
	pb.Leave()
	require.Eventually(t, func() bool { return len(pc.wake) == 1 }, 10*time.Second, time.Millisecond, "c is told")
}

// What a store makes of the messages on a key's channels: a notice in
// the old form, or with a word it does not know, or naming no store,
// wakes a caller as a plain one does; an announcement's wait is read
// within bounds, and its own are skipped.
func TestNoticesAsHeard(t *testing.T) {
	a, _, _ := turnStores(t, false)
	ctx := context.Background()
	pa := place(t, a)
	send := func(channel, payload string) {
		require.NoError(t, a.rdb.Do(ctx, "spublish", channel, payload).Err())
	}
	for _, payload := range []string{"x", "x all", "x to", "x to " + a.id, "x later 5"} {
		send(a.keys.Free("k"), payload)
		require.Eventually(t, func() bool { return len(pa.wake) == 1 }, 10*time.Second, time.Millisecond, payload)
		<-pa.wake
	}
	send(a.keys.Free("k"), "x to y")
	send(a.keys.Free("k"), a.id)
	send(a.keys.Turns("k"), "neg waits -5")
	send(a.keys.Turns("k"), "huge hello 99999999999999999")
	send(a.keys.Turns("k"), "junk waits soon")
	send(a.keys.Turns("k"), a.id+" waits 1")
	drained(t, a)
	require.Empty(t, pa.wake, "another store's turn, and a's own notice")
	a.notices.mu.Lock()
	others := a.notices.subs["k"].others
	a.notices.mu.Unlock()
	require.Equal(t, time.Duration(0), others["neg"].age)
	require.Equal(t, maxWaited, others["huge"].age)
	require.Equal(t, time.Duration(0), others["junk"].age)
	require.NotContains(t, others, a.id)
}

// A process cut off from Redis (its connections closed, as when it dies)
// says nothing more; a turn a release gives it meanwhile reaches the
// other waiting process, told by the notice's reply.
func TestTurnOfACutOffProcessIsPassedOn(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	a := storeOn(t, redis.NewClient(&redis.Options{Addr: srv.Addr}))
	b := storeOn(t, redis.NewClient(&redis.Options{Addr: proxy.Addr, MaxRetries: -1}))
	c := storeOn(t, redis.NewClient(&redis.Options{Addr: srv.Addr}))
	for _, s := range []*Store{a, b, c} {
		s.announceEvery, s.heardWithin = time.Hour, 2*time.Hour
	}
	ctx := t.Context()
	require.NoError(t, a.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 1}))
	held, _, err := a.Allocate(ctx, waitReq(0))
	require.NoError(t, err)
	place(t, b)
	pc := place(t, c)
	place(t, a)
	require.Eventually(t, func() bool { return knows(a, b.id) && knows(a, c.id) }, 10*time.Second, time.Millisecond)
	settled(t, a, c)

	proxy.SetDown(true)
	require.Eventually(t, func() bool {
		n, err := srv.Client(t).PubSubShardNumSub(ctx, a.keys.Free("k")).Result()
		return err == nil && n[a.keys.Free("k")] == 2
	}, 10*time.Second, 10*time.Millisecond, "the server dropped b's subscription")
	require.True(t, knows(a, b.id), "a still counts on b")
	heardAs(a, map[string]time.Duration{b.id: time.Hour, c.id: 0})
	require.NoError(t, a.Release(ctx, held.LeaseRef))
	require.Eventually(t, func() bool { return len(pc.wake) == 1 }, 10*time.Second, time.Millisecond, "c is told")
}

// A process that stops announcing (cut off from Redis by the fault proxy,
// so it says nothing, not even "left") is forgotten once heardWithin has
// passed, and a release no longer names it; while it announces it stays
// known, however long it waits.
func TestSilentProcessIsForgotten(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	a := storeOn(t, redis.NewClient(&redis.Options{Addr: srv.Addr}))
	b := storeOn(t, redis.NewClient(&redis.Options{Addr: proxy.Addr, MaxRetries: -1}))
	for _, s := range []*Store{a, b} {
		s.announceEvery, s.heardWithin = 10*time.Millisecond, time.Second
	}
	ctx := t.Context()
	require.NoError(t, a.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 1}))
	place(t, a)
	parkIn(t, b, place(t, b))
	require.Eventually(t, func() bool {
		to, _ := a.turn("k")
		return to == b.id
	}, 10*time.Second, time.Millisecond, "b said its caller waits")
	for end := time.Now().Add(2 * a.heardWithin); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		to, _ := a.turn("k")
		require.Equal(t, b.id, to, "b announces: known, and its caller waits longer than a's none")
	}

	proxy.SetDown(true)
	require.Eventually(t, func() bool {
		to, _ := a.turn("k")
		return to != b.id && !knows(a, b.id)
	}, 10*time.Second, 10*time.Millisecond, "b is silent: forgotten")
}

// Announcements go out in the background, so they may be sent while the
// caller closes its client (a "left" queued as the last waiter leaves, a
// "waits" due). Through a Ring, whose pipelines can panic when it closes
// meanwhile (go-redis v9.23 reads its shards without checking), that must
// fail quietly, not crash the process: announcements keep being queued
// while the Ring closes, many times over.
func TestAnnouncementsWhileRingCloses(t *testing.T) {
	srv := redistest.Start(t)
	for range 100 {
		ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"only": srv.Addr}})
		s, err := New(ring, nil)
		require.NoError(t, err)
		require.NoError(t, s.SyncKey(t.Context(), KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 1}))
		p, err := s.Await(t.Context(), []string{"k"})
		require.NoError(t, err)
		stop := make(chan struct{})
		said := make(chan struct{})
		go func() {
			defer close(said)
			for {
				select {
				case <-stop:
					return
				default:
				}
				s.notices.mu.Lock()
				s.notices.say(s, "k", noticeWaits)
				s.notices.mu.Unlock()
				runtime.Gosched()
			}
		}()
		time.Sleep(time.Duration(rand.N(3000)) * time.Microsecond)
		require.NoError(t, ring.Close())
		close(stop)
		<-said
		p.Leave()
		require.Eventually(t, func() bool {
			s.notices.mu.Lock()
			defer s.notices.mu.Unlock()
			return !s.notices.saying && len(s.notices.said) == 0
		}, 10*time.Second, time.Millisecond, "every announcement sent, or tried")
	}
}
