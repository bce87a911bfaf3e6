package optimistic

import (
	"context"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/test/redistest"
)

// lineLen is how many tickets wait in keyID's line.
func (l *lines) lineLen(keyID string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m[keyID])
}

type allocated struct {
	lease Lease
	stats Stats
	err   error
	pool  string // asked for
	i     int    // place in line (lineUpCalls)
}

// keyStore is a Store on rdb with opts and key k (provider p, pool
// default) of limit 5.
func keyStore(t *testing.T, rdb redis.UniversalClient, opts *Options) *Store {
	t.Helper()
	s, err := New(rdb, opts)
	require.NoError(t, err)
	require.NoError(t, s.SyncKey(t.Context(), KeyState{ID: "k", Provider: "p", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 5}))
	return s
}

// lineUp holds k's turn and starts one allocation of k per pool, one
// after the other in its line; they report on the channel returned, and
// release lets them go.
func lineUp(t *testing.T, s *Store, pools ...string) (out chan allocated, release func()) {
	calls := make([]lineCall, len(pools))
	for i, pool := range pools {
		calls[i].pool = pool
	}
	return lineUpCalls(t, s, calls...)
}

// lineCall is one allocation of k that lineUpCalls starts: of pool, and
// marked WithWaiting if waits.
type lineCall struct {
	pool  string
	waits bool
}

// lineUpCalls is lineUp for calls.
func lineUpCalls(t *testing.T, s *Store, calls ...lineCall) (out chan allocated, release func()) {
	t.Helper()
	release, err := s.enter(t.Context(), "k", true)
	require.NoError(t, err)
	out = make(chan allocated, len(calls))
	for i, c := range calls {
		want := s.lines.lineLen("k") + 1
		go func() {
			ctx := t.Context()
			if c.waits {
				ctx = WithWaiting(ctx)
			}
			l, st, err := s.Allocate(ctx, AllocateRequest{Provider: "p", Pool: c.pool, Candidates: []string{"k"}, TTL: time.Minute})
			out <- allocated{lease: l, stats: st, err: err, pool: c.pool, i: i}
		}()
		// In line, and asleep at the turn (behind the holder and those
		// before): the gate counts a user before it sleeps, and the
		// turn goes to the callers in the order they fell asleep.
		require.Eventually(t, func() bool {
			return s.lines.lineLen("k") == want && s.gates.Users("k") == want+1 && asleepAtTheGate() == want
		}, 5*time.Second, time.Millisecond)
	}
	return out, release
}

// asleepAtTheGate counts lineUpCalls's callers asleep in keygate's Enter.
func asleepAtTheGate() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, " [select") && strings.Contains(g, "keygate.(*Set).Enter") && strings.Contains(g, "optimistic.lineUpCalls") {
			n++
		}
	}
	return n
}

// granted collects n grants from out and checks their fences differ.
func granted(t *testing.T, out <-chan allocated, n int) (attempts int) {
	t.Helper()
	var fences []int64
	for range n {
		got := <-out
		require.NoError(t, got.err)
		require.Equal(t, "default", got.lease.Pool)
		fences = append(fences, got.lease.Fence)
		attempts += got.stats.Attempts
	}
	require.Len(t, slices.Compact(slices.Sorted(slices.Values(fences))), n, "fences %v", fences)
	return attempts
}

func requireLive(t *testing.T, s *Store, want int) {
	t.Helper()
	infos, err := s.Inspect(t.Context(), "k")
	require.NoError(t, err)
	require.Equal(t, want, infos[0].Live)
	require.Zero(t, s.lines.lineLen("k"), "nothing stays in line")
}

// Calls waiting for a key's turn are granted by its holder in one commit:
// one read-decide round for all of them, each its own lease and fence, and
// a call whose pool the key does not serve stays in line.
func TestWaitingCallsShareTheHoldersCommit(t *testing.T) {
	s := keyStore(t, redistest.Start(t).Client(t), nil)
	out, release := lineUp(t, s, "default", "default", "default", "default", "vip")
	release()
	// The vip call may answer before the granted calls do.
	defaults := make(chan allocated, 4)
	var vip allocated
	for range 5 {
		if got := <-out; got.pool == "vip" {
			vip = got
		} else {
			defaults <- got
		}
	}
	require.Equal(t, 1, granted(t, defaults, 4), "one read-decide round granted all four")
	require.ErrorIs(t, vip.err, ErrNoCapacity, "a vip call is no member of the key's pool")
	requireLive(t, s, 4)
}

// When the reply of a commit that carried others' grants is lost, every
// call still ends with one lease, and the key with one slot taken per
// call: a lease id is its call's own, so after the commit that landed,
// neither a recheck nor a second grant of it takes another slot.
func TestLostReplyOfASharedCommit(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	s := keyStore(t, rdb, nil)
	out, release := lineUp(t, s, "default", "default", "default")
	proxy.CutNextExec()
	release()
	granted(t, out, 3)
	require.Equal(t, 1, proxy.Cuts())
	requireLive(t, s, 3)
}

// A shared commit that no replica acknowledged (the server has none)
// grants nobody: the calls it carried go back in line, each then fails as
// its own grant would, and no lease or record is left.
func TestUnreplicatedSharedCommitGivesEveryLeaseBack(t *testing.T) {
	srv := redistest.Start(t)
	s := keyStore(t, srv.Client(t), &Options{MinReplicas: 1, ReplicaTimeout: 10 * time.Millisecond})
	out, release := lineUp(t, s, "default", "default", "default")
	release()
	for range 3 {
		got := <-out
		require.ErrorIs(t, got.err, errUnreplicated, "got %+v", got.lease)
	}
	requireLive(t, s, 0)
	require.Empty(t, srv.Find(t, ":lease:"), "no lease record left")
}

// A call that gives up while in line leaves nothing behind: no ticket for
// a later holder to grant, no lease.
func TestCallLeavingTheLineTakesNoSlot(t *testing.T) {
	s := keyStore(t, redistest.Start(t).Client(t), nil)
	release, err := s.enter(t.Context(), "k", true)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, _, err := s.Allocate(ctx, AllocateRequest{Provider: "p", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute})
		done <- err
	}()
	require.Eventually(t, func() bool { return s.lines.lineLen("k") == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.Zero(t, s.lines.lineLen("k"))
	release()

	_, st, err := s.Allocate(t.Context(), AllocateRequest{Provider: "p", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, 1, st.Attempts)
	requireLive(t, s, 1)
}

// A call that reads a key full answers with that read the calls in line
// for its turn whose callers wait for a slot (WithWaiting), of its
// provider and pool: they learn it without a read of their own, and when
// it frees up. A retrying caller's call, and a call of another pool,
// still read for themselves.
func TestFullReadAnswersWaitingCallsInLine(t *testing.T) {
	s := keyStore(t, redistest.Start(t).Client(t), nil)
	for range 5 {
		_, _, err := s.Allocate(t.Context(), AllocateRequest{Provider: "p", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute})
		require.NoError(t, err)
	}
	out, release := lineUpCalls(t, s,
		lineCall{pool: "default", waits: true}, // holds the turn next: reads
		lineCall{pool: "default"},              // retrying: reads
		lineCall{pool: "default", waits: true}, // told
		lineCall{pool: "vip", waits: true},     // another pool: reads
		lineCall{pool: "default", waits: true}, // told
	)
	release()
	got := make([]allocated, 5)
	for range got {
		a := <-out
		got[a.i] = a
	}
	var first *CapacityError
	require.ErrorAs(t, got[0].err, &first)
	require.False(t, first.FreeAt.IsZero(), "frees when a lease ends")
	for i, want := range []int{1, 1, 0, 1, 0} {
		require.ErrorIs(t, got[i].err, ErrNoCapacity, "call %d", i)
		require.Equal(t, want, got[i].stats.Attempts, "call %d: reads", i)
		if want == 0 {
			var full *CapacityError
			require.ErrorAs(t, got[i].err, &full)
			require.Equal(t, first.FreeAt, full.FreeAt, "call %d: when it frees up, as read", i)
		}
	}
	requireLive(t, s, 5)
}

// A holder's read answers only the tickets posted before it was sent: one
// posted while it was on the wire (by a caller woken by a release the
// read may not show) waits for the turn and reads for itself.
func TestDenyAnswersOnlyTicketsPostedBeforeTheRead(t *testing.T) {
	var l lines
	waiting := func() *ticket {
		return &ticket{provider: "p", pool: "default", waits: true, done: make(chan struct{}), wake: func() {}}
	}
	before, after := waiting(), waiting()
	l.post("k", before)
	mark := l.mark()
	l.post("k", after)
	l.deny("k", "p", "default", mark, 42, true)
	require.True(t, before.full)
	require.Equal(t, int64(42), before.free)
	require.True(t, before.held)
	require.False(t, after.full)
	require.Equal(t, 1, l.lineLen("k"), "the later ticket stays in line")
}

// The holder marks the line before it sends its read, not after the reply:
// a waiting call that joins the line while the read is on the wire (here,
// once its reply is in but before the holder looks at it) reads for
// itself when the read says full.
func TestLineIsMarkedBeforeTheReadIsSent(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t).(*redis.Client)
	s := keyStore(t, rdb, nil)
	full := AllocateRequest{Provider: "p", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute}
	for range 5 {
		_, _, err := s.Allocate(t.Context(), full)
		require.NoError(t, err)
	}
	late := make(chan allocated, 1)
	var once sync.Once
	rdb.AddHook(afterReadOf{key: s.keys.Key("k"), fn: func() {
		once.Do(func() {
			go func() {
				l, st, err := s.Allocate(WithWaiting(t.Context()), full)
				late <- allocated{lease: l, stats: st, err: err}
			}()
			require.Eventually(t, func() bool { return s.lines.lineLen("k") == 1 }, 5*time.Second, time.Millisecond)
		})
	}})
	_, first, err := s.Allocate(WithWaiting(t.Context()), full)
	require.ErrorIs(t, err, ErrNoCapacity)
	require.Equal(t, 1, first.Attempts)
	got := <-late
	require.ErrorIs(t, got.err, ErrNoCapacity)
	require.Equal(t, 1, got.stats.Attempts, "joined the line after the read was sent: reads for itself")
	requireLive(t, s, 5)
}
