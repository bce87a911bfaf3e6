package keygate

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// waitUsers waits until key has n users; the test fails if it never does.
func waitUsers(t *testing.T, s *Set, key string, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return s.Users(key) == n }, 10*time.Second, 100*time.Microsecond,
		"%d users of %s", n, key)
}

// waitParked waits until n goroutines are parked in Enter, waiting for a
// turn; the test fails if they never are.
func waitParked(t *testing.T, n int) {
	t.Helper()
	buf := make([]byte, 1<<20)
	require.Eventually(t, func() bool {
		parked := 0
		for g := range strings.SplitSeq(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "[select") && strings.Contains(g, "keygate.(*Set).Enter(") {
				parked++
			}
		}
		return parked == n
	}, 10*time.Second, 100*time.Microsecond, "%d callers parked in Enter", n)
}

func TestTryEnterNeverWaits(t *testing.T) {
	var s Set
	release, ok := s.TryEnter("a")
	require.True(t, ok)
	_, ok = s.TryEnter("a")
	require.False(t, ok, "taken")
	require.Equal(t, 1, s.Users("a"), "a failed TryEnter holds nothing")
	other, ok := s.TryEnter("b")
	require.True(t, ok, "keys are independent")
	other()
	release()
	require.Zero(t, s.Len())
	release, ok = s.TryEnter("a")
	require.True(t, ok, "free again")
	release()
}

// Waiters get the turn in the order they came, and TryEnter cannot take
// it between a release and the next waiter.
func TestEnterIsFirstComeFirstServed(t *testing.T) {
	var s Set
	ctx := t.Context()
	hold, err := s.Enter(ctx, "k")
	require.NoError(t, err)
	const waiters = 8
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	errs := make(chan error, waiters)
	for i := range waiters {
		wg.Go(func() {
			release, err := s.Enter(ctx, "k")
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			release()
		})
		waitUsers(t, &s, "k", i+2)
		// Counted is not yet in line: each waiter must be parked before
		// the next one starts, or two could swap places.
		waitParked(t, i+1)
	}
	hold()
	_, ok := s.TryEnter("k")
	require.False(t, ok, "the turn went straight to the first waiter")
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, order)
	require.Zero(t, s.Len())
}

// A wait that ctx ends holds nothing and does not take the turn from the
// waiters behind it.
func TestEnterEndsWithCtx(t *testing.T) {
	var s Set
	hold, err := s.Enter(t.Context(), "k")
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	gaveUp := make(chan error, 1)
	go func() {
		_, err := s.Enter(ctx, "k")
		gaveUp <- err
	}()
	waitUsers(t, &s, "k", 2)
	next := make(chan func(), 1)
	go func() {
		release, err := s.Enter(t.Context(), "k")
		if err != nil {
			release = nil
		}
		next <- release
	}()
	waitUsers(t, &s, "k", 3)
	cancel()
	require.ErrorIs(t, <-gaveUp, context.Canceled)
	require.Equal(t, 2, s.Users("k"), "the cancelled wait left")
	hold()
	release := <-next
	require.NotNil(t, release, "the waiter behind got the turn")
	release()
	require.Zero(t, s.Len())
}

// Under a crowd of Enter and TryEnter calls on a few keys, no key ever has
// two holders, every Enter gets its turn, and no gate is left behind.
func TestOneHolderPerKey(t *testing.T) {
	var s Set
	const (
		keys    = 3
		callers = 16
		rounds  = 200
	)
	var (
		inside  [keys]atomic.Int32
		entered atomic.Int64
		wg      sync.WaitGroup
	)
	errs := make(chan error, callers)
	for c := range callers {
		wg.Go(func() {
			for r := range rounds {
				k := (c + r) % keys
				var (
					release func()
					err     error
				)
				if r%3 == 0 {
					var ok bool
					if release, ok = s.TryEnter(fmt.Sprint(k)); !ok {
						continue
					}
				} else if release, err = s.Enter(t.Context(), fmt.Sprint(k)); err != nil {
					errs <- err
					return
				}
				if n := inside[k].Add(1); n != 1 {
					errs <- fmt.Errorf("key %d has %d holders", k, n)
				}
				entered.Add(1)
				inside[k].Add(-1)
				release()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.GreaterOrEqual(t, entered.Load(), int64(callers*rounds*2/3), "every Enter got its turn")
	require.Zero(t, s.Len())
}
