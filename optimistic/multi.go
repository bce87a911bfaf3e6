package optimistic

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// cmd is one command of a transaction's body: its name and arguments.
type cmd []any

// pipeliner is what a client and a transaction both offer.
type pipeliner interface {
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// errUnreplicated says a write happened on the master but fewer replicas
// than Options.MinReplicas acknowledged it in time: a failover may lose it.
var errUnreplicated = errors.New("optimistic: too few replicas acknowledged the write")

// multi sends MULTI, body and EXEC in one round trip on c, followed, when
// the store asks replicas to acknowledge its writes (Options.MinReplicas),
// by WAIT in the same round trip. It returns EXEC's replies, one per body
// command, and whether EXEC ran (which drops any WATCH of c). An aborted
// EXEC (a watched key changed) is redis.TxFailedErr; too few
// acknowledgements is errUnreplicated, with the replies: the writes did
// happen on the master.
//
// The commands go out as plain ones (MULTI and EXEC included) so that WAIT
// can follow EXEC in the same round trip, which go-redis's TxPipelined
// cannot do; each queued command answers QUEUED, and EXEC the results.
func (s *Store) multi(ctx context.Context, c pipeliner, body []cmd) (replies []any, ran bool, err error) {
	var (
		exec *redis.Cmd
		wait *redis.Cmd
	)
	// The pipeline's own error is the first command's: EXEC's and WAIT's
	// are read below.
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "multi")
		for _, c := range body {
			p.Do(ctx, c...)
		}
		exec = p.Do(ctx, "exec")
		if s.opts.MinReplicas > 0 {
			wait = p.Do(ctx, s.waitArgs()...)
		}
		return nil
	})
	switch err := exec.Err(); {
	case errors.Is(err, redis.Nil):
		return nil, true, redis.TxFailedErr
	case redis.IsExecAbortError(err):
		return nil, true, err
	case err != nil:
		// Sent or not, ran or not: the caller cannot know.
		return nil, false, err
	}
	replies, _ = exec.Val().([]any)
	for _, r := range replies {
		if rerr, ok := r.(error); ok {
			return replies, true, rerr
		}
	}
	if wait != nil {
		return replies, true, s.acked(wait)
	}
	return replies, true, nil
}

// txPipelined runs body as MULTI/EXEC on tx through go-redis's own
// TxPipelined, for a transaction whose WATCH go-redis sent: go-redis then
// knows whether EXEC dropped the watch, and only if not sends UNWATCH when
// the transaction closes. WAIT, when the store asks for it, follows on the
// same connection in a round trip of its own. It says whether EXEC ran, by
// go-redis's own rule, and fails as multi does.
func (s *Store) txPipelined(ctx context.Context, tx *redis.Tx, body []cmd) (ran bool, err error) {
	_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for _, c := range body {
			p.Do(ctx, c...)
		}
		return nil
	})
	if err != nil {
		return errors.Is(err, redis.TxFailedErr) || redis.IsExecAbortError(err), err
	}
	if s.opts.MinReplicas > 0 {
		return true, s.acked(tx.Do(ctx, s.waitArgs()...))
	}
	return true, nil
}

// waitArgs is the WAIT command for Options.MinReplicas.
func (s *Store) waitArgs() []any {
	return []any{"wait", s.opts.MinReplicas, s.opts.ReplicaTimeout.Milliseconds()}
}

// acked turns WAIT's reply into errUnreplicated if too few replicas
// acknowledged the writes before it in time.
func (s *Store) acked(wait *redis.Cmd) error {
	n, err := wait.Int64()
	if err != nil {
		return fmt.Errorf("%w: %w", errUnreplicated, err)
	}
	if n < int64(s.opts.MinReplicas) {
		return fmt.Errorf("%w: %d of %d within %v", errUnreplicated, n, s.opts.MinReplicas, s.opts.ReplicaTimeout)
	}
	return nil
}

// write runs body as one transaction on c and returns EXEC's replies. On a
// plain client (a standalone server, a cluster node) it is multi. Other
// clients (a Ring, a whole Cluster after a slot moved) route the commands
// themselves, which go-redis's TxPipelined does but a plain pipeline of
// MULTI and EXEC would not; WAIT cannot follow there, so with MinReplicas
// set such a write counts as unacknowledged.
func (s *Store) write(ctx context.Context, c redis.UniversalClient, body []cmd) ([]any, error) {
	if plain, ok := c.(*redis.Client); ok {
		replies, _, err := s.multi(ctx, plain, body)
		return replies, err
	}
	cmds := make([]*redis.Cmd, len(body))
	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i, b := range body {
			cmds[i] = p.Do(ctx, b...)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	replies := make([]any, len(cmds))
	for i, c := range cmds {
		replies[i] = c.Val()
	}
	if s.opts.MinReplicas > 0 {
		return replies, fmt.Errorf("%w: no WAIT through %T", errUnreplicated, c)
	}
	return replies, nil
}
