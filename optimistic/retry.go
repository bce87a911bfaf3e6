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

// conflict marks an aborted EXEC (a watched key changed) as ErrConflict.
func conflict(err error) error {
	if errors.Is(err, redis.TxFailedErr) {
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
