package broker_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
)

// A key's live state, once read, ranks it without another read: kept up
// by this process's grants and releases, dropped when the store skipped
// the key (another process took it), read again in the background once
// older than LiveMaxAge.
func TestLiveStateKept(t *testing.T) {
	e := newEnv(t, key("a", "default", 1), key("b", "default", 1), key("c", "default", 1))
	s := &hookStore{Store: e.store}
	b := broker.New(e.cat, s, &broker.Options{Inspect: -1, LiveMaxAge: time.Hour, Logger: e.log})

	first := allocate(t, b, req("default"))
	require.EqualValues(t, 1, s.inspects.Load(), "the first allocate reads every candidate")
	second := allocate(t, b, req("default"))
	require.EqualValues(t, 1, s.inspects.Load(), "the second reads none")
	require.NotEqual(t, first.KeyID, second.KeyID, "its own grant made the first key full")
	require.Len(t, s.recorded()[1].order, 3)
	require.Equal(t, first.KeyID, s.recorded()[1].order[2], "full goes last")

	// Another process takes the last key: this one still counts it free,
	// tries it first, and is told full.
	other := allocate(t, e.plain(), req("default"))
	_, err := b.Allocate(t.Context(), req("default"))
	capacityError(t, err)
	require.Equal(t, other.KeyID, s.recorded()[2].order[0])

	// The store skipped every key: the next allocate reads them, and its
	// own release made the released one free.
	require.NoError(t, b.Release(t.Context(), first.LeaseRef))
	before := s.inspects.Load()
	require.Equal(t, first.KeyID, allocate(t, b, req("default")).KeyID)
	require.Greater(t, s.inspects.Load(), before)
}

// A state older than LiveMaxAge still ranks the allocate that finds it,
// which starts a read of it in the background; with a negative
// LiveMaxAge every allocate reads.
func TestLiveStateRefreshed(t *testing.T) {
	keys := []catalog.Key{key("a", "default", 5), key("b", "default", 5)}
	t.Run("in the background", func(t *testing.T) {
		e := newEnv(t, keys...)
		s := &hookStore{Store: e.store}
		b := broker.New(e.cat, s, &broker.Options{Inspect: -1, LiveMaxAge: time.Millisecond, Logger: e.log})
		g := allocate(t, b, req("default"))
		require.NoError(t, b.Release(t.Context(), g.LeaseRef))
		time.Sleep(2 * time.Millisecond)
		reads := s.inspects.Load()
		g = allocate(t, b, req("default"))
		require.NoError(t, b.Release(t.Context(), g.LeaseRef))
		require.Eventually(t, func() bool { return s.inspects.Load() > reads }, 10*time.Second, time.Millisecond)
	})
	t.Run("never kept", func(t *testing.T) {
		e := newEnv(t, keys...)
		s := &hookStore{Store: e.store}
		b := broker.New(e.cat, s, &broker.Options{Inspect: -1, LiveMaxAge: -1, Logger: e.log})
		for i := range 3 {
			g := allocate(t, b, req("default"))
			require.NoError(t, b.Release(t.Context(), g.LeaseRef))
			require.EqualValues(t, i+1, s.inspects.Load())
		}
	})
}
