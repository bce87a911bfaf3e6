//go:build !linux

package workload

import (
	"context"
	"time"
)

// holdClock times one caller's holds: here Go's timers (see hold_linux.go
// for why Linux adds a timerfd).
type holdClock struct{}

func newHoldClock() (*holdClock, error) { return &holdClock{}, nil }

func (*holdClock) close() {}

// hold uses a slot for d, and says whether it held d in full.
func (*holdClock) hold(ctx context.Context, d time.Duration) bool { return Sleep(ctx, d) }
