package workload

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// never is longer than any test runs: an alarm set to it must not be the
// one that ends a wait.
const never = time.Minute

func newClock(t *testing.T) *holdClock {
	t.Helper()
	c, err := newHoldClock()
	require.NoError(t, err)
	t.Cleanup(c.close)
	return c
}

// Each alarm alone ends a wait, never before its time.
func TestHoldClockEitherAlarmEndsTheWait(t *testing.T) {
	c := newClock(t)
	for range 20 {
		start := time.Now()
		c.wait(time.Millisecond, never)
		took := time.Since(start)
		require.GreaterOrEqual(t, took, time.Millisecond)
		require.Less(t, took, never, "the timerfd ended it")

		start = time.Now()
		c.wait(never, time.Millisecond)
		took = time.Since(start)
		require.GreaterOrEqual(t, took, time.Millisecond)
		require.Less(t, took, never, "the deadline ended it")
	}
}

// An expiry nobody read (the timerfd fired after a deadline ended the
// wait) cannot end the next hold early.
func TestHoldClockLateExpiryDoesNotShortenTheNext(t *testing.T) {
	c := newClock(t)
	for range 10 {
		require.NoError(t, unix.TimerfdSettime(c.fd, 0, &unix.ItimerSpec{Value: unix.NsecToTimespec(int64(time.Millisecond))}, nil))
		time.Sleep(3 * time.Millisecond) // fired, unread
		start := time.Now()
		require.True(t, c.hold(context.Background(), 5*time.Millisecond))
		require.GreaterOrEqual(t, time.Since(start), 5*time.Millisecond)

		c.wait(2*time.Millisecond, time.Millisecond)
		time.Sleep(3 * time.Millisecond)
		start = time.Now()
		require.True(t, c.hold(context.Background(), 5*time.Millisecond))
		require.GreaterOrEqual(t, time.Since(start), 5*time.Millisecond)
	}
}

func TestHoldClockHoldsInFull(t *testing.T) {
	c := newClock(t)
	for _, d := range []time.Duration{0, 100 * time.Microsecond, time.Millisecond, 3 * time.Millisecond, preciseHold + time.Millisecond} {
		start := time.Now()
		require.True(t, c.hold(context.Background(), d))
		require.GreaterOrEqual(t, time.Since(start), d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.False(t, c.hold(ctx, time.Millisecond), "ctx ended: not held in full")
	start := time.Now()
	require.False(t, c.hold(ctx, never), "a long hold ends with ctx")
	require.Less(t, time.Since(start), never)
}

// A run whose callers cannot all get a clock fails, saying why, and
// leaves no descriptor open. The file limit is the process's: this test
// must not run in parallel with others.
func TestRunWithoutFileDescriptors(t *testing.T) {
	// The poller's own descriptors exist before counting.
	c, err := newHoldClock()
	require.NoError(t, err)
	c.close()
	open := func() int {
		fds, err := os.ReadDir("/proc/self/fd")
		require.NoError(t, err)
		return len(fds)
	}
	var limit syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &limit))
	t.Cleanup(func() { require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &limit)) })
	before := open()
	low := limit
	low.Cur = uint64(before + 8)
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low))

	s := spec()
	s.Workers = 64
	_, err = Run(context.Background(), newMemStore(), s, NewHolders(1, 2), 1)
	require.ErrorContains(t, err, "timerfd_create")
	require.ErrorIs(t, err, syscall.EMFILE)
	require.Equal(t, before, open())
}
