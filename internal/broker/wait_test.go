package broker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/optimistic"
)

// waitingReq is req(pool) that waits up to wait for a slot.
func waitingReq(pool string, wait time.Duration) broker.Request {
	r := req(pool)
	r.Wait = wait
	return r
}

// allocateLater starts a waiting Allocate and returns its outcome's
// channel once the broker's store has it in line.
func allocateLater(t *testing.T, e *env, b *broker.Broker, r broker.Request) <-chan allocResult {
	t.Helper()
	done := make(chan allocResult, 1)
	before := e.store.Waiting()
	go func() {
		g, err := b.Allocate(t.Context(), r)
		done <- allocResult{g, err}
	}()
	require.Eventually(t, func() bool { return e.store.Waiting() == before+1 }, 10*time.Second, time.Millisecond)
	return done
}

func TestAllocateWaits(t *testing.T) {
	t.Run("a release hands the slot to the waiting request", func(t *testing.T) {
		e := newEnv(t, key("d", "default", 1))
		b := e.plain()
		held := allocate(t, b, req("default"))
		done := allocateLater(t, e, b, waitingReq("default", time.Minute))
		require.NoError(t, b.Release(t.Context(), held.LeaseRef))
		r := <-done
		require.NoError(t, r.err)
		require.Equal(t, "d", r.g.KeyID)
		require.Equal(t, "sk-d", string(r.g.Secret))
		require.Equal(t, 1, e.live(t, "d"))
	})

	t.Run("a waiting vip request is served by default", func(t *testing.T) {
		e := newEnv(t, key("v", "vip", 1), key("d", "default", 1))
		b := e.plain()
		allocate(t, b, req("vip"))
		fallback := allocate(t, b, req("vip"))
		require.Equal(t, "d", fallback.KeyID)
		done := allocateLater(t, e, b, waitingReq("vip", time.Minute))
		require.NoError(t, b.Release(t.Context(), fallback.LeaseRef))
		r := <-done
		require.NoError(t, r.err)
		require.Equal(t, "d", r.g.KeyID)
	})

	t.Run("the wait ends full", func(t *testing.T) {
		e := newEnv(t, key("d", "default", 1))
		b := e.plain()
		allocate(t, b, req("default"))
		start := time.Now()
		_, err := b.Allocate(t.Context(), waitingReq("default", 30*time.Millisecond))
		capacityError(t, err)
		require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond, "full before the wait ended")
		require.Zero(t, e.store.Waiting())
	})

	t.Run("every try of a waiting request is marked waiting, others not", func(t *testing.T) {
		e := newEnv(t, key("d", "default", 1))
		s := &hookStore{Store: e.store}
		b := e.broker(e.cat, s)
		allocate(t, b, req("default"))
		_, err := b.Allocate(t.Context(), waitingReq("default", 30*time.Millisecond))
		capacityError(t, err)
		calls := s.recorded()
		require.GreaterOrEqual(t, len(calls), 3, "the grant, and the waiting request's first try and one in line")
		require.False(t, calls[0].waits, "a request that does not wait")
		for i, c := range calls[1:] {
			require.True(t, c.waits, "try %d of the waiting request", i+1)
		}
	})

	t.Run("cancelled while waiting takes nothing", func(t *testing.T) {
		e := newEnv(t, key("d", "default", 1))
		b := e.plain()
		held := allocate(t, b, req("default"))
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			_, err := b.Allocate(ctx, waitingReq("default", time.Minute))
			done <- err
		}()
		require.Eventually(t, func() bool { return e.store.Waiting() == 1 }, 10*time.Second, time.Millisecond)
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		require.NoError(t, b.Release(t.Context(), held.LeaseRef))
		require.Zero(t, e.live(t, "d"))
	})

	t.Run("StopWaiting ends the wait at once and takes nothing", func(t *testing.T) {
		e := newEnv(t, key("d", "default", 1))
		b := e.plain()
		held := allocate(t, b, req("default"))
		done := allocateLater(t, e, b, waitingReq("default", time.Minute))
		b.StopWaiting()
		var r allocResult
		select {
		case r = <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("still waiting after StopWaiting: it would wait its whole minute")
		}
		require.ErrorIs(t, r.err, broker.ErrShuttingDown)
		require.NotErrorIs(t, r.err, optimistic.ErrNoCapacity, "not full: this instance stops waiting")
		require.Zero(t, e.store.Waiting())
		require.Equal(t, 1, e.live(t, "d"), "the holder's slot alone")

		_, err := b.Allocate(t.Context(), waitingReq("default", time.Minute))
		require.ErrorIs(t, err, broker.ErrShuttingDown, "a wait asked for after StopWaiting does not start")
		require.NoError(t, b.Release(t.Context(), held.LeaseRef))
		require.Zero(t, e.live(t, "d"))
		g, err := b.Allocate(t.Context(), waitingReq("default", time.Minute))
		require.NoError(t, err, "a free slot is still granted")
		require.Equal(t, "d", g.KeyID)
		require.NoError(t, b.Release(t.Context(), g.LeaseRef))
		g = allocate(t, b, req("default"))
		require.Equal(t, "d", g.KeyID, "requests that do not wait are served as before")
	})

	t.Run("negative wait is invalid", func(t *testing.T) {
		e := newEnv(t, key("d", "default", 1))
		_, err := e.plain().Allocate(t.Context(), waitingReq("default", -time.Second))
		require.ErrorIs(t, err, optimistic.ErrInvalid)
	})
}
