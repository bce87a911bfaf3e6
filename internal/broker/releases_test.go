package broker

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	rs "github.com/credpool/credpool/internal/redisschema"
	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/test/redistest"
)

// barrierStore holds the first Release of one lease until the test lets
// it go, then releases it; a later Release of that lease finds it gone.
// Every other Release fails as an outage would. The backlog calls nothing
// else.
type barrierStore struct {
	optimistic.LeaseStore
	lease   string
	arrived chan struct{} // closed when the first Release of lease blocks
	proceed chan struct{} // closed by the test

	mu    sync.Mutex
	calls int // Releases of lease
}

func (s *barrierStore) Release(_ context.Context, ref optimistic.LeaseRef) error {
	if ref.LeaseID != s.lease {
		return fmt.Errorf("%w: injected outage", optimistic.ErrStore)
	}
	s.mu.Lock()
	s.calls++
	n := s.calls
	s.mu.Unlock()
	if n > 1 {
		return fmt.Errorf("%w: lease %s", optimistic.ErrLeaseLost, ref.LeaseID)
	}
	close(s.arrived)
	<-s.proceed
	return nil
}

// A round asked for while another runs (a request's on-demand flush during
// the background retry) must not send the same releases again: counted
// twice, they would also take the key's other pending releases out of
// stuck, and a full pool on a broken store would answer "full" (429)
// instead of "the store is down" (503).
func TestBacklogRunsOneRoundAtATime(t *testing.T) {
	s := &barrierStore{lease: "l1", arrived: make(chan struct{}), proceed: make(chan struct{})}
	q := newBacklog(s, slog.New(slog.NewTextHandler(t.Output(), nil)))
	ref := func(id string) optimistic.LeaseRef {
		return optimistic.LeaseRef{Provider: "openai", Pool: "default", KeyID: "a", LeaseID: id}
	}

	q.add(ref("l1"))
	<-s.arrived // the background round is in the store with l1
	flushed := q.round(t.Context(), "a")
	q.add(ref("l2")) // the store is down for this one
	close(s.proceed)
	q.close(t.Context()) // waits for the background round; l2 fails again

	require.Equal(t, 1, q.stuck("a"), "l2 still waits for the store")
	require.Equal(t, Backlog{Pending: 1, Released: 1}, q.stats())
	require.Equal(t, 1, s.calls, "l1 went to the store once")
	require.False(t, flushed, "a round was already under way")
}

// scriptedStore answers each Release by fail (nil: released), once the
// test lets it through gate (nil: at once). The backlog calls nothing
// else.
type scriptedStore struct {
	optimistic.LeaseStore
	fail  func(ref optimistic.LeaseRef) error
	gate  chan struct{}
	calls atomic.Int32
}

func (s *scriptedStore) Release(_ context.Context, ref optimistic.LeaseRef) error {
	s.calls.Add(1)
	if s.gate != nil {
		<-s.gate
	}
	return s.fail(ref)
}

// backlogOf returns a backlog over s with a release pending on each of
// keys, and no background loop: the test runs the rounds.
func backlogOf(t *testing.T, s optimistic.LeaseStore, keys ...string) *backlog {
	q := newBacklog(s, slog.New(slog.NewTextHandler(t.Output(), nil)))
	for _, k := range keys {
		ref := optimistic.LeaseRef{Provider: "openai", Pool: "default", KeyID: k, LeaseID: "l-" + k}
		q.pending[k] = map[string]optimistic.LeaseRef{ref.LeaseID: ref}
		q.counts.Pending++
	}
	return q
}

// A key whose server does not answer while the others do (a Redis Cluster
// master down) holds up no release on the others: the round goes on past
// it, and leaves it for the next.
func TestBacklogGoesOnPastAnUnreachableKey(t *testing.T) {
	var keys, dead []string
	for i := range 40 {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	for i := range 3 {
		dead = append(dead, fmt.Sprintf("dead%d", i))
	}
	s := &scriptedStore{fail: func(ref optimistic.LeaseRef) error {
		if strings.HasPrefix(ref.KeyID, "dead") {
			return fmt.Errorf("%w: %w: injected", optimistic.ErrStore, optimistic.ErrUnreachable)
		}
		return nil
	}}
	q := backlogOf(t, s, append(keys, dead...)...)
	require.False(t, q.round(t.Context()), "some still wait")
	require.Zero(t, q.stuck(keys...), "every release on a server that answers went through")
	require.Equal(t, len(dead), q.stuck(dead...))
}

// A store that fails otherwise (down as a whole) ends the round once the
// releases under way are over: no more are sent to it.
func TestBacklogStopsWhenTheStoreIsDown(t *testing.T) {
	var keys []string
	for i := range 3 * retryWorkers {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	s := &scriptedStore{gate: make(chan struct{}), fail: func(optimistic.LeaseRef) error {
		return fmt.Errorf("%w: injected outage", optimistic.ErrStore)
	}}
	q := backlogOf(t, s, keys...)
	done := make(chan bool)
	go func() { done <- q.round(t.Context()) }()
	require.Eventually(t, func() bool { return s.calls.Load() == retryWorkers }, 10*time.Second, time.Millisecond,
		"the round sends up to retryWorkers keys' releases at once")
	close(s.gate)
	require.False(t, <-done)
	require.Equal(t, int32(retryWorkers), s.calls.Load(), "none sent after the first failure came back")
	require.Equal(t, len(keys), q.stuck(keys...))
}

// On a real cluster of two masters, one killed: the round releases every
// lease on the master that answers, and leaves those on the dead one.
func TestBacklogGoesOnPastADeadMaster(t *testing.T) {
	c := redistest.StartClusterN(t, 2, 0)
	store, err := optimistic.New(c.Client(t), nil)
	require.NoError(t, err)
	ctx := t.Context()
	victim := c.Nodes[0]
	keys := rs.Schema{Prefix: rs.DefaultPrefix}
	var live, dead []string
	q := newBacklog(store, slog.New(slog.NewTextHandler(t.Output(), nil)))
	for i := 0; len(live) < 48 || len(dead) < 4; i++ {
		id := fmt.Sprintf("k%d", i)
		m, _, err := c.MasterOf(ctx, keys.Key(id))
		require.NoError(t, err)
		if m == victim {
			if len(dead) == 4 {
				continue
			}
			dead = append(dead, id)
		} else {
			if len(live) == 48 {
				continue
			}
			live = append(live, id)
		}
		require.NoError(t, store.SyncKey(ctx, optimistic.KeyState{ID: id, Provider: "openai", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: 1}))
		l, _, err := store.Allocate(ctx, optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{id}, TTL: time.Minute})
		require.NoError(t, err)
		q.pending[id] = map[string]optimistic.LeaseRef{l.LeaseID: l.LeaseRef}
		q.counts.Pending++
	}
	c.Kill(victim)

	require.False(t, q.round(ctx), "the dead master's wait")
	require.Zero(t, q.stuck(live...), "every release on the master that answers went through")
	require.Equal(t, len(dead), q.stuck(dead...))
	infos, err := store.Inspect(ctx, live...)
	require.NoError(t, err)
	for _, in := range infos {
		require.Zero(t, in.Live, in.ID)
	}
}
