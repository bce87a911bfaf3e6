package optimistic

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/credpool/credpool/internal/retry"
)

// errRecheck asks for one more round after a commit whose reply was lost:
// the next read tells whether it landed. It is no conflict: if the budget
// runs out on it, the call failed on the store, not on contention.
var errRecheck = errors.New("optimistic: commit outcome unknown")

// conflict marks as ErrConflict an attempt that wrote nothing and may
// succeed if made again: an aborted EXEC (a watched key changed), or Redis
// Cluster moving the key's slot under the transaction (see rerouted), be
// it the reads, EXEC, or a command queued in MULTI and so an EXECABORT.
// The attempt is then read and decided afresh, never resent as it was.
func conflict(err error) error {
	switch {
	case errors.Is(err, ErrConflict), errors.Is(err, errUnreplicated):
		// errUnreplicated: EXEC did commit; try gives the grant back.
		return err
	case errors.Is(err, redis.TxFailedErr), rerouted(err) && !redis.IsClusterDownError(err):
		// CLUSTERDOWN is not: nobody serves the slot, which a retry does
		// not mend within a call (see unreachable).
		return fmt.Errorf("%w: %w", ErrConflict, err)
	}
	return err
}

func retryable(err error) bool {
	return errors.Is(err, ErrConflict) || errors.Is(err, errRecheck)
}

// retry runs op under the store's policy until it returns nil or an error
// that is neither a conflict nor a lost commit reply.
func (s *Store) retry(ctx context.Context, op func() error) error {
	return retry.Do(ctx, s.policy, retryable, op)
}
