package handlers

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A wait asked for is capped at nine tenths of the time left before the
// request's deadline, so that a wait that runs out is answered 429, not
// timed out; a request without a deadline, or that asks for none, keeps
// what it asked.
func TestWaitFor(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	got := waitFor(ctx, 30*time.Second)
	require.LessOrEqual(t, got, 9*time.Second)
	require.Greater(t, got, 8*time.Second)
	require.Equal(t, time.Second, waitFor(ctx, time.Second), "within the cap")
	require.Zero(t, waitFor(ctx, 0), "no wait asked")
	require.Equal(t, 30*time.Second, waitFor(t.Context(), 30*time.Second), "no deadline")

	past, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
	defer cancel()
	require.Zero(t, waitFor(past, time.Second), "no time left")
}
