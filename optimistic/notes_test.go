package optimistic

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/test/redistest"
)

// A lost race holds the key off for 1 to holdOffSpan times the attempt's
// duration; losing again as soon as the hold-off ended doubles the range,
// up to holdOffDoublings times; a grant, or a long quiet spell, starts
// over.
func TestHoldOffs(t *testing.T) {
	// Long, so that a loaded machine's pause between two lines here is
	// no "long quiet spell": nothing sleeps for it.
	const took = 100 * time.Millisecond
	var h notes
	require.True(t, h.until("k").IsZero(), "none yet")
	for losses := range holdOffDoublings + 2 {
		start := time.Now()
		h.hold("k", took, time.Hour)
		end := time.Now()
		scale := time.Duration(1) << min(losses, holdOffDoublings)
		require.GreaterOrEqual(t, h.until("k").Sub(start), took*scale, "loss %d", losses+1)
		require.Less(t, h.until("k").Sub(end), took*holdOffSpan*scale, "loss %d", losses+1)
		require.Equal(t, losses+1, h.m["k"].losses)
		// The hold-off just ended: the process comes back and loses again.
		h.m["k"] = note{until: time.Now(), losses: h.m["k"].losses}
	}
	h.won("k")
	require.True(t, h.until("k").IsZero(), "a grant ends it")
	h.hold("k", took, time.Hour)
	require.Equal(t, 1, h.m["k"].losses, "a grant starts over")
	h.m["k"] = note{until: time.Now().Add(-holdOffSpan * took * 2), losses: 3}
	require.True(t, h.until("k").IsZero(), "over")
	h.hold("k", took, time.Hour)
	require.Equal(t, 1, h.m["k"].losses, "lost long after the last hold-off: starts over")

	// However long the lost attempt took (a slow pool, a slow server),
	// the hold-off is bounded.
	h.hold("slow", time.Minute, 64*time.Millisecond)
	require.LessOrEqual(t, time.Until(h.until("slow")), 64*time.Millisecond)
}

// Keys held off long ago are dropped once many are noted.
func TestHoldOffsSweep(t *testing.T) {
	var h notes
	for i := range notesSweep {
		h.hold(fmt.Sprint("k", i), time.Nanosecond, time.Hour)
	}
	time.Sleep(skipFor + time.Millisecond)
	h.hold("last", time.Nanosecond, time.Hour)
	require.Len(t, h.m, 1, "only the last one is left")
}

// A process that lost a race on a key reads it again only once its
// hold-off ended (at least as long as the lost attempt took), and the
// grant it then makes ends the hold-off.
func TestLostRaceHoldsKeyOff(t *testing.T) {
	s, other, req := narrowStore(t, 2)
	rival, err := New(other, nil)
	require.NoError(t, err)
	var (
		reads []time.Time
		execs []time.Time
	)
	s.rdb.AddHook(timeline{reads: &reads, execs: &execs, afterRead: func() {
		if len(reads) == 1 {
			_, _, err := rival.Allocate(context.Background(), req)
			require.NoError(t, err)
		}
	}})
	_, st, err := s.Allocate(t.Context(), req)
	require.NoError(t, err)
	require.Equal(t, 1, st.Conflicts)
	require.Len(t, reads, 2)
	require.Len(t, execs, 2)
	took := execs[0].Sub(reads[0])
	require.GreaterOrEqual(t, reads[1].Sub(execs[0]), took, "read again before the hold-off ended")
	require.True(t, s.notes.until("k").IsZero(), "the grant ended the hold-off")
}

// timeline is a go-redis hook that notes when each pipeline that reads
// under WATCH starts (calling afterRead once it ran) and when each
// MULTI..EXEC ends.
type timeline struct {
	reads, execs *[]time.Time
	afterRead    func()
}

func (timeline) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (timeline) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h timeline) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmds)
		for _, c := range cmds {
			switch c.Name() {
			case "watch":
				*h.reads = append(*h.reads, start)
				h.afterRead()
				return err
			case "exec":
				*h.execs = append(*h.execs, time.Now())
				return err
			}
		}
		return err
	}
}

// conflictOnce makes the first attempt on key lose its race: another
// client writes the key HASH right after the attempt's read.
type conflictOnce struct {
	key   string
	done  atomic.Bool
	other redis.UniversalClient
}

func (*conflictOnce) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (*conflictOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *conflictOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if args := c.Args(); c.Name() == "watch" && len(args) > 1 && args[1] == h.key && h.done.CompareAndSwap(false, true) {
				h.other.HSet(ctx, h.key, "touched", "1")
			}
		}
		return err
	}
}

// After a lost race the call goes on to its other candidates instead of
// waiting out the hold-off on the one it lost.
func TestLostRaceTriesOthersFirst(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	s, err := New(rdb, nil)
	require.NoError(t, err)
	ctx := t.Context()
	for _, id := range []string{"hot", "cold"} {
		require.NoError(t, s.SyncKey(ctx, KeyState{ID: id, Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 5}))
	}
	rdb.(*redis.Client).AddHook(&conflictOnce{key: s.keys.Key("hot"), other: srv.Client(t)})
	l, st, err := s.Allocate(ctx, AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"hot", "cold"}, TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, 1, st.Conflicts)
	require.Equal(t, "cold", l.KeyID, "cold had room: no reason to wait for hot")
}

// A hold-off that begins while a caller waits for the key's turn (another
// caller of the process lost a race meanwhile) is honoured once the turn
// is taken: the caller reads the key only after it ends.
func TestHoldOffBegunWhileWaitingForTurn(t *testing.T) {
	srv := redistest.Start(t)
	s, err := New(srv.Client(t), nil)
	require.NoError(t, err)
	ctx := t.Context()
	require.NoError(t, s.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 5}))
	release, err := s.enter(ctx, "k", true)
	require.NoError(t, err)
	type result struct {
		at  time.Time
		err error
	}
	done := make(chan result, 1)
	go func() {
		_, _, err := s.Allocate(ctx, AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute})
		done <- result{time.Now(), err}
	}()
	require.Eventually(t, func() bool { return s.gates.Users("k") == 2 }, 10*time.Second, time.Millisecond)
	s.notes.hold("k", 20*time.Millisecond, 50*time.Millisecond)
	until := s.notes.until("k")
	release()
	r := <-done
	require.NoError(t, r.err)
	require.False(t, r.at.Before(until), "read the key during the hold-off")
}

// A call whose candidates are all busy waits for the one likely to come
// free first: a key whose turn another caller holds, rather than one this
// process holds off, whatever their order; and a hold-off that begins
// while it waits for a key's turn sends it to the other candidates.
func TestBusyCandidatesWaitForTheSoonest(t *testing.T) {
	srv := redistest.Start(t)
	s, err := New(srv.Client(t), nil)
	require.NoError(t, err)
	ctx := t.Context()
	for _, id := range []string{"a", "b"} {
		require.NoError(t, s.SyncKey(ctx, KeyState{ID: id, Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 5}))
	}
	req := AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"a", "b"}, TTL: time.Minute}
	allocate := func() <-chan Lease {
		got := make(chan Lease, 1)
		go func() {
			l, _, err := s.Allocate(ctx, req)
			assert.NoError(t, err)
			got <- l
		}()
		return got
	}

	// Held off for an hour: only the grant on b ends the call.
	holdOff := func(t *testing.T) {
		s.notes.hold("a", time.Hour, time.Hour)
		t.Cleanup(func() { s.notes.won("a") })
	}

	t.Run("held off", func(t *testing.T) {
		holdOff(t)
		release := enterOnce(t, s, "b")
		got := allocate()
		require.Eventually(t, func() bool { return s.gates.Users("b") == 2 }, 10*time.Second, time.Millisecond)
		release()
		l := <-got
		require.Equal(t, "b", l.KeyID)
		require.False(t, s.notes.until("a").IsZero(), "granted before the hold-off on a ended")
		require.NoError(t, s.Release(ctx, l.LeaseRef))
	})

	t.Run("held off while waiting for the turn", func(t *testing.T) {
		releaseA, releaseB := enterOnce(t, s, "a"), enterOnce(t, s, "b")
		got := allocate()
		require.Eventually(t, func() bool { return s.gates.Users("a") == 2 }, 10*time.Second, time.Millisecond)
		holdOff(t)
		releaseA()
		require.Eventually(t, func() bool { return s.gates.Users("b") == 2 }, 10*time.Second, time.Millisecond)
		releaseB()
		l := <-got
		require.Equal(t, "b", l.KeyID)
		require.False(t, s.notes.until("a").IsZero(), "granted before the hold-off on a ended")
	})
}

// enterOnce takes keyID's gate in s and returns its release, which may be
// called more than once: the test's end calls it too.
func enterOnce(t *testing.T, s *Store, keyID string) func() {
	t.Helper()
	release, err := s.enter(t.Context(), keyID, true)
	require.NoError(t, err)
	once := sync.OnceFunc(release)
	t.Cleanup(once)
	return once
}

// skipNoted says whether s holds a skip note on keyID, however old.
func skipNoted(s *Store, keyID string) bool {
	s.notes.mu.Lock()
	defer s.notes.mu.Unlock()
	return !s.notes.m[keyID].skip.IsZero()
}
