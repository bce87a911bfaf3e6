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
	l := newLive(nil, time.Millisecond, slog.Default())
	start := time.Now()
	l.put([]optimistic.KeyInfo{{ID: "gone", Exists: true}, {ID: "kept", Exists: true}}, start)
	later := start.Add(liveForget*time.Millisecond + time.Millisecond)
	l.put([]optimistic.KeyInfo{{ID: "kept", Exists: true}}, later)
	_, missing := l.get([]string{"gone", "kept"})
	require.Equal(t, []int{0}, missing)
}
