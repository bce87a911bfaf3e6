package optimistic

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// turnStores returns three stores on one redis-server (or one-node
// cluster) sharing key k of limit 1, which announce only when they begin
// to wait (and answer those who do): no repeated "waits" to blur a test.
func turnStores(t *testing.T, cluster bool) (a, b, c *Store) {
	t.Helper()
	a, b = waitStores(t, cluster)
	if cluster {
		c = storeOn(t, redis.NewClusterClient(&redis.ClusterOptions{Addrs: a.rdb.(*redis.ClusterClient).Options().Addrs}))
	} else {
		c = storeOn(t, redis.NewClient(&redis.Options{Addr: a.rdb.(*redis.Client).Options().Addr}))
	}
	for _, s := range []*Store{a, b, c} {
		s.announceEvery = time.Hour
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
		sub.others[id] = waiting{at: time.Now(), age: age}
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
		delete(s.notices.subs["k"].others, marker)
		s.notices.mu.Unlock()
	}
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
// store wakes a caller.
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
	require.Eventually(t, func() bool { return parked(a) == 1 && knows(a, b.id) && knows(a, c.id) }, 10*time.Second, time.Millisecond)

	heardAs(a, map[string]time.Duration{b.id: 0, c.id: 0})
	require.NoError(t, a.Release(ctx, held.LeaseRef))
	require.NoError(t, <-waited)
	got, ok := pa.Handed()
	require.True(t, ok, "a's own turn: handed over")
	pa.Leave()

	heardAs(a, map[string]time.Duration{b.id: time.Hour, c.id: time.Minute})
	require.NoError(t, a.Release(ctx, got.LeaseRef))
	require.Eventually(t, func() bool { return len(pb.wake) == 1 }, 10*time.Second, time.Millisecond, "b's turn")
	drained(t, a, c)
	require.Empty(t, pc.wake, "c's caller sleeps")
	require.Empty(t, next.wake, "a's caller sleeps")
	to, _ := a.turn("k")
	require.Equal(t, c.id, to, "b counts as just served: c's turn next")
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
// turnSlack longer; a store given the turn counts as just served; one not
// heard from for two announcements counts no more, and then a store that
// last heard itself alone keeps the slot.
func TestTurnGoesToTheLongestWaiting(t *testing.T) {
	a, _, _ := turnStores(t, false)
	pa := place(t, a)
	other := func(heard, age time.Duration) {
		a.notices.mu.Lock()
		defer a.notices.mu.Unlock()
		sub := a.notices.subs["k"]
		sub.listeners = 1
		sub.others = map[string]waiting{"b": {at: time.Now().Add(-heard), age: age}}
	}
	for _, c := range []struct {
		name       string
		heard, age time.Duration
		to         string
	}{
		{"b's caller waited far longer", 0, time.Minute, "b"},
		{"b's caller waited since it was heard", time.Minute, 0, "b"},
		{"a's caller waited longer", 0, 0, a.id},
	} {
		other(c.heard, c.age)
		to, expect := a.turn("k")
		require.Equal(t, c.to, to, c.name)
		if to == "b" {
			require.EqualValues(t, 2, expect, "a and b listen")
			to, _ = a.turn("k")
			require.Equal(t, a.id, to, "b was just served")
		}
	}
	require.True(t, a.queue.Wake("k"))
	other(0, 0)
	to, _ := a.turn("k")
	require.Equal(t, "b", to, "a's caller, woken, is served already")
	<-pa.wake

	other(2*time.Hour, time.Minute) // announceEvery is an hour
	to, _ = a.turn("k")
	require.Equal(t, a.id, to, "b not heard from lately: a listened alone when last heard")
	require.False(t, knows(a, "b"))

	pa.Leave()
	to, _ = a.turn("k")
	require.Empty(t, to, "nobody waits here")
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
