package workload

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// preciseHold is the longest hold timed by holdClock's two alarms; a
// longer one sleeps on a timer, so that ctx can end it.
const preciseHold = 50 * time.Millisecond

// holdClock times one caller's holds. A hold ends at whichever comes
// first of two alarms set for the same instant, and no thread blocks:
//
//   - a timerfd, read through Go's network poller: it wakes an idle
//     process within microseconds, where a Go timer alone would not (an
//     idle process waits for its next timer in the poller, in whole
//     milliseconds, so the holds of a process whose callers wait in line,
//     idle between grants, would run ~0.5 ms longer than those of a busy
//     one, and the benchmark would measure the hold, not the store);
//   - a Go timer (the read's deadline): a busy process's scheduler checks
//     its timers at every switch, while its poller, polled less often when
//     every CPU is busy, would be late.
//
// The harness used nanosleep(2) before: precise, but it blocks a thread
// per hold, and when the runtime was late taking the CPU back from those
// (thousands a second) whole runs slowed down to a third.
type holdClock struct {
	f  *os.File
	fd int
}

func newHoldClock() (*holdClock, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("workload: timerfd_create: %w", err)
	}
	// Non-blocking, so the file's reads wait in the poller, if it took
	// the file: a file it did not take has no deadlines.
	c := &holdClock{f: os.NewFile(uintptr(fd), "timerfd"), fd: fd}
	if err := c.f.SetReadDeadline(time.Time{}); err != nil {
		c.close()
		return nil, fmt.Errorf("workload: a timerfd in the network poller: %w", err)
	}
	return c, nil
}

func (c *holdClock) close() { _ = c.f.Close() }

// hold uses a slot for d, and says whether ctx was still live when the
// hold ended (a hold up to preciseHold runs in full either way).
func (c *holdClock) hold(ctx context.Context, d time.Duration) bool {
	if d > preciseHold {
		return Sleep(ctx, d)
	}
	if d > 0 {
		c.wait(d, d)
	}
	return ctx.Err() == nil
}

// wait returns when the timerfd, armed to fire after fire, fires or the
// read's deadline, after deadline, passes, whichever comes first. hold
// sets both alike; tests set them apart to take each path. Should arming
// fail (it takes a valid fd and time), the deadline ends the wait; should
// the read fail otherwise, the wait sleeps out the rest on a Go timer.
func (c *holdClock) wait(fire, deadline time.Duration) {
	start := time.Now()
	_ = unix.TimerfdSettime(c.fd, 0, &unix.ItimerSpec{Value: unix.NsecToTimespec(fire.Nanoseconds())}, nil)
	_ = c.f.SetReadDeadline(start.Add(deadline))
	var expirations [8]byte
	_, err := c.f.Read(expirations[:])
	if err == nil {
		return
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// Disarmed, the timerfd wakes nobody. (An expiry that lands
		// meanwhile cannot end the next hold early: arming clears the
		// count.)
		_ = unix.TimerfdSettime(c.fd, 0, &unix.ItimerSpec{}, nil)
		return
	}
	time.Sleep(min(fire, deadline) - time.Since(start))
}
