package broker

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/optimistic"
)

// A key's live state is forgotten once nobody asked for it for
// liveForget times maxAge (a key deleted from the catalog leaves none
// behind); the states of keys asked for stay.
func TestLiveStateForgotten(t *testing.T) {
	l := newLive(nil, time.Hour, slog.Default())
	now := time.Now()
	l.put([]optimistic.KeyInfo{{ID: "gone", Exists: true}, {ID: "kept", Exists: true}}, now.Add(-2*liveForget*time.Hour))
	l.put([]optimistic.KeyInfo{{ID: "kept", Exists: true}}, now)
	_, missing := l.get([]string{"gone", "kept"})
	require.Equal(t, []int{0}, missing)
	l.mu.Lock()
	defer l.mu.Unlock()
	require.NotContains(t, l.keys, "gone", "swept, not only too old to rank")
	require.Contains(t, l.keys, "kept")
}

// A read that started before a drop does not bring the dropped state
// back; one that started after does.
func TestLiveStateDropWins(t *testing.T) {
	l := newLive(nil, time.Hour, slog.Default())
	before := time.Now()
	l.put([]optimistic.KeyInfo{{ID: "k", Exists: true}}, before)
	l.drop("k")
	l.put([]optimistic.KeyInfo{{ID: "k", Exists: true, Live: 1}}, before)
	_, missing := l.get([]string{"k"})
	require.Equal(t, []int{0}, missing)
	l.put([]optimistic.KeyInfo{{ID: "k", Exists: true, Live: 1}}, time.Now())
	got, missing := l.get([]string{"k"})
	require.Empty(t, missing)
	require.Equal(t, 1, got[0].Live)
}

// inspectFails is a store whose Inspect fails, as one that went away.
type inspectFails struct{ optimistic.LeaseStore }

func (inspectFails) Inspect(ctx context.Context, ids ...string) ([]optimistic.KeyInfo, error) {
	return nil, optimistic.Classify(ctx, "inspect", errors.New("injected fault"))
}

// A background read that fails drops the states it was to read: the next
// allocate reads them itself rather than rank on them.
func TestLiveStateBackgroundReadFails(t *testing.T) {
	l := newLive(inspectFails{}, time.Hour, slog.Default())
	defer l.close(context.Background())
	l.put([]optimistic.KeyInfo{{ID: "k", Exists: true}}, time.Now().Add(-2*time.Hour))
	_, missing := l.get([]string{"k"})
	require.Empty(t, missing, "stale, but still ranks while it is read again")
	require.Eventually(t, func() bool {
		_, missing := l.get([]string{"k"})
		return len(missing) == 1
	}, time.Minute, time.Millisecond)
	require.Zero(t, l.reads().Background)
}

// inspectBlocks is a store whose Inspect waits for its ctx to end, as one
// that stopped answering; done is closed once it returned.
type inspectBlocks struct {
	optimistic.LeaseStore
	started, done chan struct{}
}

func (s inspectBlocks) Inspect(ctx context.Context, ids ...string) ([]optimistic.KeyInfo, error) {
	defer close(s.done)
	close(s.started)
	<-ctx.Done()
	return nil, ctx.Err()
}

// close ends a background read under way and waits for it: the store may
// be closed right after.
func TestLiveCloseEndsTheBackgroundRead(t *testing.T) {
	store := inspectBlocks{started: make(chan struct{}), done: make(chan struct{})}
	l := newLive(store, time.Hour, slog.Default())
	l.put([]optimistic.KeyInfo{{ID: "k", Exists: true}}, time.Now().Add(-2*time.Hour))
	_, missing := l.get([]string{"k"})
	require.Empty(t, missing, "stale: read again in the background")
	<-store.started
	l.close(t.Context())
	select {
	case <-store.done:
	default:
		t.Fatal("close returned while the background read still ran")
	}
}
