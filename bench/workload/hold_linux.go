package workload

import (
	"context"
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
//     process within microseconds, where a Go timer alone would not (the
//     poller's wait for the next timer is rounded up to whole
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
	// Non-blocking, so the file's reads wait in the poller.
	return &holdClock{f: os.NewFile(uintptr(fd), "timerfd"), fd: fd}, nil
}

func (c *holdClock) close() { _ = c.f.Close() }

// hold uses a slot for d, and says whether it held d in full.
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
// sets both alike; tests set them apart to take each path.
func (c *holdClock) wait(fire, deadline time.Duration) {
	start := time.Now()
	// Should arming fail (it takes a valid fd and time), the deadline
	// still ends the wait on time.
	_ = unix.TimerfdSettime(c.fd, 0, &unix.ItimerSpec{Value: unix.NsecToTimespec(fire.Nanoseconds())}, nil)
	_ = c.f.SetReadDeadline(start.Add(deadline))
	var expirations [8]byte
	if _, err := c.f.Read(expirations[:]); err != nil {
		// The deadline came first: disarmed, the timerfd wakes nobody.
		// (An expiry that lands meanwhile cannot end the next hold early:
		// arming clears the count.)
		_ = unix.TimerfdSettime(c.fd, 0, &unix.ItimerSpec{}, nil)
	}
}
