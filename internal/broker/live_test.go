package broker_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
)

// capacityOnly ranks by free slots alone, ties in the catalog's order.
var capacityOnly = &broker.Weights{Capacity: 1}

// A key's live state, once read, ranks it without another read: kept up
// by this process's grants and releases, one slot busier for a key the
// store passed over, dropped after an allocate that found none free (the
// next reads them).
func TestLiveStateKept(t *testing.T) {
	e := newEnv(t, key("a", "default", 1), key("b", "default", 1), key("c", "default", 1))
	s := &hookStore{Store: e.store}
	b := broker.New(e.cat, s, &broker.Options{Inspect: -1, LiveMaxAge: time.Hour, Weights: capacityOnly, Logger: e.log})
	other := broker.New(e.cat, e.store, &broker.Options{Inspect: -1, LiveMaxAge: -1, Weights: capacityOnly, Logger: e.log})

	require.Equal(t, "a", allocate(t, b, req("default")).KeyID)
	require.EqualValues(t, 1, s.inspects.Load(), "the first allocate reads every candidate")
	require.Equal(t, broker.LiveReads{Read: 3}, b.LiveReads())
	// Another process takes b, which this one still counts free: the
	// store passes over it and grants c, with no read.
	taken := allocate(t, other, req("default"))
	require.Equal(t, "b", taken.KeyID)
	c := allocate(t, b, req("default"))
	require.Equal(t, "c", c.KeyID)
	require.Equal(t, []string{"b", "c", "a"}, s.recorded()[1].order)
	require.EqualValues(t, 1, s.inspects.Load(), "the second allocate reads none")
	require.Equal(t, broker.LiveReads{Kept: 3, Read: 3}, b.LiveReads())

	// Released here, c is free again; b now counts as full.
	require.NoError(t, b.Release(t.Context(), c.LeaseRef))
	require.Equal(t, "c", allocate(t, b, req("default")).KeyID)
	order := s.recorded()[2].order
	require.Equal(t, "c", order[0])
	require.ElementsMatch(t, []string{"a", "b"}, order[1:], "b went last with a")
	require.EqualValues(t, 1, s.inspects.Load())

	// Every key full: the store finds none, and the next allocate reads
	// the keys again, so it sees b, released by the other process, free.
	_, err := b.Allocate(t.Context(), req("default"))
	capacityError(t, err)
	require.NoError(t, other.Release(t.Context(), taken.LeaseRef))
	require.Equal(t, "b", allocate(t, b, req("default")).KeyID)
	calls := s.recorded()
	require.Equal(t, "b", calls[len(calls)-1].order[0], "read again, not ranked as known")
}

// A state older than LiveMaxAge still ranks the allocate that finds it,
// which does not wait for the read of it that starts in the background;
// with a negative LiveMaxAge every allocate reads.
func TestLiveStateRefreshed(t *testing.T) {
	keys := []catalog.Key{key("a", "default", 5), key("b", "default", 5)}
	t.Run("in the background", func(t *testing.T) {
		e := newEnv(t, keys...)
		s := &hookStore{Store: e.store}
		b := broker.New(e.cat, s, &broker.Options{Inspect: -1, LiveMaxAge: 200 * time.Millisecond, Logger: e.log})
		g := allocate(t, b, req("default"))
		require.NoError(t, b.Release(t.Context(), g.LeaseRef))
		require.EqualValues(t, 1, s.inspects.Load())

		entered, release := make(chan struct{}, 1), make(chan struct{})
		gate := func() error {
			entered <- struct{}{}
			<-release
			return nil
		}
		s.inspectGate.Store(&gate)
		time.Sleep(250 * time.Millisecond) // past LiveMaxAge, within four times it
		done := make(chan error, 1)
		go func() {
			g, err := b.Allocate(t.Context(), req("default"))
			if err == nil {
				err = b.Release(t.Context(), g.LeaseRef)
			}
			done <- err
		}()
		<-entered
		select {
		case err := <-done:
			require.NoError(t, err, "granted while the read was held")
		case <-time.After(time.Minute):
			t.Fatal("the allocate waited for the read of the live state")
		}
		close(release)
		require.Eventually(t, func() bool { return b.LiveReads().Background == 2 }, time.Minute, time.Millisecond)
		b.Close(t.Context())
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
