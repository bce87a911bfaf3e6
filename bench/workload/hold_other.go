//go:build !linux

package workload

import (
	"context"
	"time"
)

// holdFor uses a slot for d (see hold_linux.go for why Linux times it
// otherwise). It says whether it held d in full.
func holdFor(ctx context.Context, d time.Duration) bool { return Sleep(ctx, d) }
