package broker

import (
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
