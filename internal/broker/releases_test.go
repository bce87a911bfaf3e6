package broker

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
	require.Zero(t, flushed, "a round was already under way")
}

// scriptedStore answers each Release by fail (nil: released). With
// nodeOf it is a store whose keys live on several servers (see nodes).
// The backlog calls nothing else.
type scriptedStore struct {
	optimistic.LeaseStore
	fail  func(ref optimistic.LeaseRef) error
	calls atomic.Int32
}

func (s *scriptedStore) Release(_ context.Context, ref optimistic.LeaseRef) error {
	s.calls.Add(1)
	return s.fail(ref)
}

type clusterStore struct{ *scriptedStore }

// Node puts the keys named dead… on a server of their own.
func (s clusterStore) Node(_ context.Context, keyID string) (string, error) {
	if strings.HasPrefix(keyID, "dead") {
		return "dead:6379", nil
	}
	return "live:6379", nil
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

// A server that does not answer while the others do (a Redis Cluster
// master down) holds up no release on the others: the round goes on with
// them, and leaves its releases, after the first that failed, for the
// next round.
func TestBacklogGoesServerByServer(t *testing.T) {
	var keys, dead []string
	for i := range 40 {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	for i := range 10 {
		dead = append(dead, fmt.Sprintf("dead%d", i))
	}
	s := &scriptedStore{fail: func(ref optimistic.LeaseRef) error {
		if strings.HasPrefix(ref.KeyID, "dead") {
			return fmt.Errorf("%w: injected timeout", optimistic.ErrStore)
		}
		return nil
	}}
	q := backlogOf(t, clusterStore{s}, append(keys, dead...)...)
	require.Equal(t, len(keys), q.round(t.Context()), "every release on the server that answers")
	require.Zero(t, q.stuck(keys...))
	require.Equal(t, len(dead), q.stuck(dead...))
	require.Equal(t, int32(len(keys)+1), s.calls.Load(), "one try on the dead server")
}

// unmappedStore is a cluster whose client cannot say where the keys
// named lost… are (no slot map, say).
type unmappedStore struct{ clusterStore }

func (s unmappedStore) Node(ctx context.Context, keyID string) (string, error) {
	if strings.HasPrefix(keyID, "lost") {
		return "", fmt.Errorf("%w: no slot map", optimistic.ErrStore)
	}
	return s.clusterStore.Node(ctx, keyID)
}

// Keys whose server nobody can name are still retried: in one line, as
// if on one server, while the known servers go on.
func TestBacklogRetriesKeysOfNoKnownServer(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	s := &scriptedStore{fail: func(ref optimistic.LeaseRef) error {
		if strings.HasPrefix(ref.KeyID, "lost") && down.Load() {
			return fmt.Errorf("%w: injected timeout", optimistic.ErrStore)
		}
		return nil
	}}
	q := backlogOf(t, unmappedStore{clusterStore{s}}, "k1", "k2", "lost0", "lost1", "lost2")
	require.Equal(t, 2, q.round(t.Context()), "the known server goes on")
	require.Equal(t, int32(3), s.calls.Load(), "one try for the line of unknown ones")
	require.Equal(t, 3, q.stuck("lost0", "lost1", "lost2"))

	down.Store(false)
	require.Equal(t, 3, q.round(t.Context()), "they are retried")
	require.Zero(t, q.stuck("lost0", "lost1", "lost2"))
}

// A store on one server (standalone Redis, SQLite) ends the round at its
// first failure: no more are sent to it.
func TestBacklogStopsWhenTheStoreIsDown(t *testing.T) {
	var keys []string
	for i := range 20 {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	s := &scriptedStore{fail: func(optimistic.LeaseRef) error {
		return fmt.Errorf("%w: injected outage", optimistic.ErrStore)
	}}
	q := backlogOf(t, s, keys...)
	require.Zero(t, q.round(t.Context()))
	require.Equal(t, int32(1), s.calls.Load())
	require.Equal(t, len(keys), q.stuck(keys...))
}

// On a real cluster of two masters, one killed or silent (stopped): a
// round releases every lease on the master that answers, and leaves
// those on the other after one try (a silent one costs the round one
// retryTimeout). A release on a killed master's key fails as unreachable.
func TestBacklogGoesOnPastADeadMaster(t *testing.T) {
	for _, fault := range []string{"killed", "silent"} {
		t.Run(fault, func(t *testing.T) {
			c := redistest.StartClusterN(t, 2, 0)
			store, err := optimistic.New(c.Client(t), nil)
			require.NoError(t, err)
			ctx := t.Context()
			victim := c.Nodes[0]
			keys := rs.Schema{Prefix: rs.DefaultPrefix}
			var live, dead []string
			var deadRef optimistic.LeaseRef
			q := newBacklog(store, slog.New(slog.NewTextHandler(t.Output(), nil)))
			for i := 0; len(live) < 24 || len(dead) < 8; i++ {
				id := fmt.Sprintf("k%d", i)
				m, _, err := c.MasterOf(ctx, keys.Leases(id))
				require.NoError(t, err)
				switch {
				case m != victim && len(live) < 24:
					live = append(live, id)
				case m == victim && len(dead) < 8:
					dead = append(dead, id)
				default:
					continue
				}
				require.NoError(t, store.SyncKey(ctx, optimistic.KeyState{ID: id, Provider: "openai", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: 1}))
				l, _, err := store.Allocate(ctx, optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{id}, TTL: time.Minute})
				require.NoError(t, err)
				q.pending[id] = map[string]optimistic.LeaseRef{l.LeaseID: l.LeaseRef}
				q.counts.Pending++
				if m == victim {
					deadRef = l.LeaseRef
				}
			}
			if fault == "killed" {
				c.Kill(victim)
				require.ErrorIs(t, store.Release(ctx, deadRef), optimistic.ErrUnreachable)
			} else {
				require.NoError(t, victim.Signal(syscall.SIGSTOP))
			}

			require.Equal(t, len(live), q.round(ctx), "every release on the master that answers")
			require.Zero(t, q.stuck(live...))
			require.Equal(t, len(dead), q.stuck(dead...))
			require.Equal(t, int64(len(live)), q.stats().Released, "the store took them back")
		})
	}
}
