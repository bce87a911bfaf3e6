package optimistic

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/test/redistest"
)

// A gate lives only while someone holds or waits for it: a process that
// touches many keys over its life, or deletes them, keeps no gate behind.
func TestGatesDoNotOutliveTheirUse(t *testing.T) {
	s, err := New(redistest.Start(t).Client(t), nil)
	require.NoError(t, err)
	ctx := t.Context()

	release, err := s.enter(ctx, "a", true)
	require.NoError(t, err)
	_, err = s.enter(ctx, "a", false)
	require.ErrorIs(t, err, errGateBusy)
	require.Equal(t, 1, s.gates.Len(), "held")
	release()
	require.Zero(t, s.gates.Len(), "released")

	const keys = 20
	for i := range keys {
		require.NoError(t, s.SyncKey(ctx, KeyState{ID: fmt.Sprint("k", i), Provider: "p", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 2}))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Go(func() {
			for i := range keys {
				l, _, err := s.Allocate(ctx, AllocateRequest{Provider: "p", Pool: "default", Candidates: []string{fmt.Sprint("k", (i+w)%keys)}, TTL: time.Minute})
				if err == nil {
					err = s.Release(ctx, l.LeaseRef)
				}
				if err != nil && !errorsIsAny(err, ErrNoCapacity, ErrContended) {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Zero(t, s.gates.Len(), "after %d keys were allocated on concurrently", keys)

	for i := range keys {
		require.NoError(t, s.DeleteKey(ctx, fmt.Sprint("k", i)))
	}
	_, err = s.ClearLeases(ctx, "never-seen")
	require.NoError(t, err)
	require.Zero(t, s.gates.Len(), "after DeleteKey and ClearLeases")
}

func errorsIsAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
