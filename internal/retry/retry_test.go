package retry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/retry"
)

var (
	errBusy   = errors.New("busy")
	errBroken = errors.New("broken")
)

func busy(err error) bool { return errors.Is(err, errBusy) }

// fast keeps the pauses short; the bounds under test are counts, not times.
var fast = retry.Policy{MaxRetries: 3, MinBackoff: time.Microsecond, MaxBackoff: time.Microsecond, MaxElapsed: time.Minute}

func TestDo(t *testing.T) {
	tests := []struct {
		name    string
		results []error // what op returns on each try; the last repeats
		tries   int
		want    error
	}{
		{"first try", []error{nil}, 1, nil},
		{"after two retries", []error{errBusy, errBusy, nil}, 3, nil},
		{"permanent error at once", []error{errBroken}, 1, errBroken},
		{"permanent after a retry", []error{errBusy, errBroken}, 2, errBroken},
		{"budget spent: the last cause", []error{errBusy}, 4, errBusy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tries, pauses := 0, 0
			var seen []error
			p := fast
			p.OnRetry = func(err error, _ time.Duration) {
				require.ErrorIs(t, err, errBusy)
				pauses++
			}
			p.OnTry = func(err error) { seen = append(seen, err) }
			err := retry.Do(t.Context(), p, busy, func() error {
				tries++
				return tt.results[min(tries, len(tt.results))-1]
			})
			if tt.want == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tt.want)
			}
			require.Equal(t, tt.tries, tries)
			require.Equal(t, tt.tries-1, pauses, "one OnRetry per pause")
			require.Len(t, seen, tt.tries, "one OnTry per try")
			for i, err := range seen {
				require.Equal(t, tt.results[min(i+1, len(tt.results))-1], err, "try %d", i+1)
			}
		})
	}
}

// When ctx ends during a pause, the caller learns both why it was retrying
// and why it stopped.
func TestDoKeepsCauseAndContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	p := retry.Policy{MaxRetries: 100, MinBackoff: time.Hour, MaxBackoff: time.Hour, MaxElapsed: 2 * time.Hour}
	p.OnRetry = func(error, time.Duration) { cancel() }
	tries := 0
	err := retry.Do(ctx, p, busy, func() error {
		tries++
		return errBusy
	})
	require.ErrorIs(t, err, errBusy)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, tries)
}

// The elapsed bound stops retrying even with pauses left.
func TestDoElapsedBound(t *testing.T) {
	p := retry.Policy{MaxRetries: 1_000_000, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond, MaxElapsed: 20 * time.Millisecond}
	err := retry.Do(t.Context(), p, busy, func() error { return errBusy })
	require.ErrorIs(t, err, errBusy)
	require.NotErrorIs(t, err, context.Canceled)
}

// Defaults apply to zero fields: ten pauses at most.
func TestDoDefaultRetries(t *testing.T) {
	tries := 0
	p := retry.Policy{MinBackoff: time.Microsecond, MaxBackoff: time.Microsecond}
	err := retry.Do(t.Context(), p, busy, func() error {
		tries++
		return errBusy
	})
	require.ErrorIs(t, err, errBusy)
	require.Equal(t, 11, tries)
}

// A ctx that ends during a try (op then fails with ctx's error, not a
// retryable one) still leaves the earlier cause in the error.
func TestDoKeepsCauseWhenCtxEndsInATry(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	tries := 0
	err := retry.Do(ctx, fast, busy, func() error {
		tries++
		if tries == 1 {
			return errBusy
		}
		cancel()
		return fmt.Errorf("query: %w", ctx.Err())
	})
	require.ErrorIs(t, err, errBusy)
	require.ErrorIs(t, err, context.Canceled)
}

// A permanent failure after a retryable one is that failure alone: the
// earlier conflict must not make a broken store look contended.
func TestDoPermanentAfterRetryIsNotTheCause(t *testing.T) {
	tries := 0
	err := retry.Do(t.Context(), fast, busy, func() error {
		if tries++; tries == 1 {
			return errBusy
		}
		return errBroken
	})
	require.ErrorIs(t, err, errBroken)
	require.NotErrorIs(t, err, errBusy)
}
