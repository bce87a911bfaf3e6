package workload

import (
	"context"
	"syscall"
	"time"
)

// preciseHold is the longest hold timed by the OS rather than Go's
// timers; a longer one sleeps on a timer, so that ctx can end it.
const preciseHold = 50 * time.Millisecond

// holdFor uses a slot for d, timed by nanosleep(2), which blocks the
// thread and wakes within tens of microseconds. Go's own timers wake an
// idle process through its network poller, whose wait is rounded up to
// whole milliseconds: a process whose callers wait in line idles between
// grants, and its holds would run ~0.5 ms longer on average than those of
// a busy process of retrying callers, which would measure the hold, not
// the store. It says whether it held d in full.
func holdFor(ctx context.Context, d time.Duration) bool {
	if d > preciseHold {
		return Sleep(ctx, d)
	}
	ts := syscall.NsecToTimespec(d.Nanoseconds())
	for {
		// The remainder is written back when a signal interrupts it.
		if err := syscall.Nanosleep(&ts, &ts); err != syscall.EINTR {
			return ctx.Err() == nil
		}
	}
}
