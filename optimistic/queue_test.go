package optimistic

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// woken reports whether p holds a wake-up, taking it.
func woken(p *Place) bool {
	select {
	case <-p.wake:
		return true
	default:
		return false
	}
}

func TestQueueWakesInArrivalOrder(t *testing.T) {
	var q Queue
	a, b, c := q.Join([]string{"k"}), q.Join([]string{"k", "j"}), q.Join([]string{"j"})
	require.Equal(t, 3, q.Len())
	require.False(t, c.Behind(), "b is still trying: c may try too")
	park(a)
	park(b)
	require.False(t, a.Behind())
	require.False(t, b.Behind(), "nobody waited on j before b")
	require.True(t, c.Behind(), "b waits on j before c")
	require.False(t, q.Join(nil).Behind(), "no keys, nobody to wait for")

	q.Wake("k")
	q.Wake("k")
	q.Wake("k") // nobody left without a wake-up on k: dropped
	require.True(t, woken(a))
	require.True(t, woken(b))
	require.False(t, woken(c), "c does not wait on k")

	q.Wake("j")
	require.True(t, woken(b), "b is first on j")
	require.False(t, woken(c))
	require.True(t, q.Join([]string{"k", "j"}).Behind(), "others wait on both its keys")
}

func TestQueueWakeAll(t *testing.T) {
	var q Queue
	a, b, c := q.Join([]string{"k"}), q.Join([]string{"k"}), q.Join([]string{"j"})
	q.WakeAll("k")
	require.True(t, woken(a))
	require.True(t, woken(b))
	require.False(t, woken(c))
}

func TestQueueLeavePassesWakeOn(t *testing.T) {
	var q Queue
	a, b := q.Join([]string{"k"}), q.Join([]string{"k"})
	q.Wake("k")
	a.Leave() // woken but gone (granted elsewhere, timed out): b gets it
	a.Leave()
	require.True(t, woken(b))
	require.False(t, b.Behind())
	b.Leave()
	require.Zero(t, q.Len())
	require.Empty(t, q.lines, "an empty line leaves nothing behind")
}

// A grant in a try of Retry wakes the others in line for the slots it
// found free besides its own: the caller trying is passed over.
func TestQueueWakeOthersPassesOverTheTry(t *testing.T) {
	var q Queue
	p, a := q.Join([]string{"k"}), q.Join([]string{"k"})
	defer p.Leave()
	defer a.Leave()
	err := p.Retry(t.Context(), time.Now().Add(time.Minute), func(ctx context.Context) error {
		require.True(t, q.WakeOthers(ctx, "k"))
		require.False(t, q.WakeOthers(ctx, "k"), "nobody but p left to wake")
		return nil
	})
	require.NoError(t, err)
	require.False(t, woken(p), "p has its slot")
	require.True(t, woken(a))

	require.True(t, q.WakeOthers(t.Context(), "k"))
	require.True(t, woken(p), "no try of a place: the first in line")
}

// A caller that leaves owing a turn on one key (taken, not tried) and
// holding another turn on a second key hands both on: two slots freed
// for this process, two callers woken.
func TestQueueLeavePassesTwoTurnsOn(t *testing.T) {
	var q Queue
	p := q.Join([]string{"x", "y"})
	a, b := q.Join([]string{"y"}), q.Join([]string{"x"})
	require.True(t, q.wakeTurn("y"))
	require.NoError(t, p.wait(t.Context(), time.Now().Add(time.Minute)))
	require.Equal(t, "y", p.owed, "p took the turn on y")
	require.True(t, q.wakeTurn("x"))
	p.Leave()
	require.True(t, woken(a), "the turn on y went on")
	require.True(t, woken(b), "the turn on x went on")
}

func TestPlaceRetry(t *testing.T) {
	var q Queue
	ctx := t.Context()
	t.Run("tries until granted", func(t *testing.T) {
		p := q.Join([]string{"k"})
		defer p.Leave()
		tries := 0
		err := p.Retry(ctx, time.Now().Add(time.Minute), func(context.Context) error {
			if tries++; tries < 3 {
				q.Wake("k") // a slot freed while trying
				return &CapacityError{}
			}
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, 3, tries)
	})
	t.Run("full when the wait ends", func(t *testing.T) {
		p := q.Join([]string{"k"})
		defer p.Leave()
		err := p.Retry(ctx, time.Now().Add(10*time.Millisecond), func(context.Context) error {
			return &CapacityError{}
		})
		require.ErrorIs(t, err, ErrNoCapacity)
	})
	t.Run("no try after the wait ends", func(t *testing.T) {
		p := q.Join([]string{"k"})
		defer p.Leave()
		tries := 0
		err := p.Retry(ctx, time.Now().Add(20*time.Millisecond), func(context.Context) error {
			tries++
			return &CapacityError{}
		})
		require.ErrorIs(t, err, ErrNoCapacity)
		require.Equal(t, 1, tries, "nobody woke it: the wait ran out without another try")
	})
	t.Run("contended keeps waiting", func(t *testing.T) {
		p := q.Join([]string{"k"})
		defer p.Leave()
		tries := 0
		err := p.Retry(ctx, time.Now().Add(time.Minute), func(context.Context) error {
			if tries++; tries == 1 {
				q.Wake("k")
				return fmt.Errorf("%w: hot key", ErrContended)
			}
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, 2, tries)
	})
	t.Run("other errors end it", func(t *testing.T) {
		p := q.Join([]string{"k"})
		defer p.Leave()
		err := p.Retry(ctx, time.Now().Add(time.Minute), func(context.Context) error { return ErrStore })
		require.ErrorIs(t, err, ErrStore)
	})
	t.Run("a wake-up taken and not used goes on", func(t *testing.T) {
		p, next := q.Join([]string{"k"}), q.Join([]string{"k"})
		defer next.Leave()
		park(next)
		tries := 0
		err := p.Retry(ctx, time.Now().Add(time.Minute), func(context.Context) error {
			if tries++; tries == 1 {
				q.Wake("k") // first in line: the wake-up is p's
				return &CapacityError{}
			}
			return ErrStore // the try it woke for never saw the slot
		})
		require.ErrorIs(t, err, ErrStore)
		require.False(t, woken(next))
		p.Leave()
		require.True(t, woken(next), "the slot p was woken for goes to the next in line")
		p.Leave()
		require.False(t, woken(next), "once")
	})
	t.Run("cancelled while waiting", func(t *testing.T) {
		p := q.Join([]string{"k"})
		defer p.Leave()
		cctx, cancel := context.WithCancel(ctx)
		tries := 0
		err := p.Retry(cctx, time.Now().Add(time.Minute), func(context.Context) error {
			tries++
			cancel()
			return &CapacityError{}
		})
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, 1, tries, "no try after ctx ended")
	})
	t.Run("behind waits for its turn", func(t *testing.T) {
		first := q.Join([]string{"k"})
		defer first.Leave()
		park(first) // it found k full
		p := q.Join([]string{"k"})
		defer p.Leave()
		until := time.Now().Add(20 * time.Millisecond)
		var triedAt time.Time
		err := p.Retry(ctx, until, func(context.Context) error {
			triedAt = time.Now()
			return nil
		})
		require.NoError(t, err)
		require.False(t, triedAt.Before(until), "tried before its turn: nobody woke it and the wait had not ended")
		require.Positive(t, p.Waited())
	})
}

// End stops a caller's wait at once, never cuts its try short, and
// leaves it a slot a release was already handing it.
func TestPlaceEnd(t *testing.T) {
	var q Queue
	ctx := t.Context()
	stopping := errors.New("stopping")
	retry := func(p *Place, try func(context.Context) error) <-chan error {
		done := make(chan error, 1)
		go func() { done <- p.Retry(ctx, time.Now().Add(time.Minute), try) }()
		return done
	}
	answer := func(t *testing.T, done <-chan error) error {
		t.Helper()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("Retry still waits after End: it would wait its whole minute")
			return nil
		}
	}
	t.Run("while waiting", func(t *testing.T) {
		p := q.Join([]string{"k"})
		defer p.Leave()
		tried := make(chan struct{}, 10)
		var ended atomic.Bool
		var triedAfter atomic.Int32
		done := retry(p, func(context.Context) error {
			if ended.Load() {
				triedAfter.Add(1)
			}
			tried <- struct{}{}
			return &CapacityError{}
		})
		<-tried
		waitParked(t, p)
		ended.Store(true)
		p.End(stopping)
		p.End(errors.New("a second cause is dropped"))
		err := answer(t, done)
		require.ErrorIs(t, err, stopping)
		require.NotErrorIs(t, err, ErrNoCapacity)
		require.Zero(t, triedAfter.Load(), "no try after End")
		require.ErrorIs(t, p.Wait(ctx, time.Now().Add(time.Minute)), stopping, "no wait after End")
	})
	t.Run("during a try", func(t *testing.T) {
		p := q.Join([]string{"k"})
		defer p.Leave()
		err := answer(t, retry(p, func(context.Context) error {
			p.End(stopping)
			return &CapacityError{}
		}))
		require.ErrorIs(t, err, stopping, "the try found no slot: no wait after it")
		p = q.Join([]string{"k"})
		defer p.Leave()
		err = answer(t, retry(p, func(context.Context) error {
			p.End(stopping)
			return nil
		}))
		require.NoError(t, err, "the try granted: the grant stands")
	})
	t.Run("ended before it starts, behind a caller in line", func(t *testing.T) {
		ahead := q.Join([]string{"k"})
		defer ahead.Leave()
		park(ahead)
		for _, full := range []bool{false, true} {
			p := q.Join([]string{"k"})
			p.End(stopping)
			tries := 0
			err := answer(t, retry(p, func(context.Context) error {
				tries++
				if full {
					return &CapacityError{}
				}
				return nil
			}))
			p.Leave()
			require.Equal(t, 1, tries, "one try, then no wait")
			if full {
				require.ErrorIs(t, err, stopping, "its one try found no slot")
			} else {
				require.NoError(t, err, "its one try granted")
			}
		}
	})
	t.Run("a slot being handed over", func(t *testing.T) {
		p := q.Join([]string{"k"})
		defer p.Leave()
		p.Offer("openai", "default", time.Minute)
		tried := make(chan struct{}, 10)
		done := retry(p, func(context.Context) error {
			tried <- struct{}{}
			return &CapacityError{}
		})
		<-tried
		var h *handoff
		require.Eventually(t, func() bool {
			h = q.claim("k", "openai", "default")
			return h != nil
		}, 10*time.Second, time.Millisecond, "p never parked")
		p.End(stopping)
		h.settle(Lease{LeaseRef: LeaseRef{KeyID: "k", LeaseID: "l"}}, true)
		require.NoError(t, answer(t, done), "the slot was p's before End")
		lease, ok := p.Handed()
		require.True(t, ok)
		require.Equal(t, "l", lease.LeaseID)
	})
}

// waitParked waits until p waits in Wait.
func waitParked(t *testing.T, p *Place) {
	t.Helper()
	require.Eventually(t, func() bool {
		p.q.mu.Lock()
		defer p.q.mu.Unlock()
		return p.parked
	}, 10*time.Second, time.Millisecond, "p never waited")
}

// park marks p as waiting in Wait, as if it had found its keys full.
func park(p *Place) {
	p.q.mu.Lock()
	defer p.q.mu.Unlock()
	p.parked = true
}
