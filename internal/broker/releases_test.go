package broker

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/optimistic"
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
