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
// EXEC (a watched key changed) is redis.TxFailedErr; one that Redis Cluster
// refused for the slot's sake, itself or a queued command, carries that
// refusal (see rerouted); too few acknowledgements is errUnreplicated,
// with the replies: the writes did happen on the master.
//
// The commands go out as plain ones (MULTI and EXEC included) so that WAIT
// can follow EXEC in the same round trip, which go-redis's TxPipelined
// cannot do; each queued command answers QUEUED, and EXEC the results.
func (s *Store) multi(ctx context.Context, c pipeliner, body []cmd) (replies []any, ran bool, err error) {
	t := txCall{body: body}
	if s.opts.MinReplicas > 0 {
		t.then = s.waitArgs()
	}
	// The pipeline's own error is the first command's: EXEC's and WAIT's
	// are read by result and acked.
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		t.queue(ctx, p)
		return nil
	})
	replies, ran, err = t.result()
	if err == nil && t.after != nil {
		err = s.acked(t.after)
	}
	return replies, ran, err
}

// txCall is one MULTI, body, EXEC and then (unless nil), as plain commands
// in a pipeline that may hold others (see coalescer). Its commands are
// never sent twice (see onceCmd): go-redis would resend a pipeline whose
// replies the network lost, and a transaction that ran would then run
// again, on what it read before, or report a release it made as unknown.
type txCall struct {
	body   []cmd
	then   cmd
	queued []redis.Cmder
	exec   *redis.Cmd
	after  *redis.Cmd
}

// queue adds the transaction to p.
func (t *txCall) queue(ctx context.Context, p redis.Pipeliner) {
	add := func(args ...any) *redis.Cmd {
		c := onceCmd{redis.NewCmd(ctx, args...)}
		_ = p.Process(ctx, c)
		return c.Cmd
	}
	add("multi")
	t.queued = make([]redis.Cmder, len(t.body))
	for i, c := range t.body {
		t.queued[i] = add(c...)
	}
	t.exec = add("exec")
	if t.then != nil {
		t.after = add(t.then...)
	}
}

// result reads EXEC's replies once the pipeline ran, and whether it ran,
// as multi says.
func (t *txCall) result() (replies []any, ran bool, err error) {
	switch err := t.exec.Err(); {
	case errors.Is(err, redis.Nil):
		return nil, true, redis.TxFailedErr
	case redis.IsExecAbortError(err):
		return nil, true, aborted(err, t.queued)
	case rerouted(err):
		// EXEC itself refused for the slot: the transaction and its WATCH
		// were discarded.
		return nil, true, err
	case err != nil:
		// Sent or not, ran or not: the caller cannot know.
		return nil, false, err
	}
	replies, ok := t.exec.Val().([]any)
	if !ok || len(replies) != len(t.body) {
		// Not EXEC's answer (the pipeline failed as a whole, say).
		return nil, false, fmt.Errorf("optimistic: unexpected EXEC reply %v", t.exec.Val())
	}
	for _, r := range replies {
		if rerr, ok := r.(error); ok {
			return replies, true, rerr
		}
	}
	return replies, true, nil
}

// txPipelined runs body as MULTI/EXEC on tx through go-redis's own
// TxPipelined, for a transaction whose WATCH go-redis sent: go-redis then
// knows whether EXEC dropped the watch, and only if not sends UNWATCH when
// the transaction closes. WAIT, when the store asks for it, follows on the
// same connection in a round trip of its own. It says whether EXEC ran, by
// go-redis's own rule, and fails as multi does.
//
// go-redis sends a transaction again after some refusals of EXEC itself
// (TRYAGAIN, CLUSTERDOWN) when the client has MaxRetries; the refusal
// dropped the WATCH, so that second MULTI…EXEC would commit unwatched,
// on what was read before. Its commands are marked never to be resent.
func (s *Store) txPipelined(ctx context.Context, tx *redis.Tx, body []cmd) (ran bool, err error) {
	queued := make([]redis.Cmder, len(body))
	_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range body {
			queued[i] = onceCmd{redis.NewCmd(ctx, c...)}
			_ = p.Process(ctx, queued[i])
		}
		return nil
	})
	if err != nil {
		ran = errors.Is(err, redis.TxFailedErr) || redis.IsExecAbortError(err)
		return ran, aborted(err, queued)
	}
	if s.opts.MinReplicas > 0 {
		return true, s.acked(tx.Do(ctx, s.waitArgs()...))
	}
	return true, nil
}

// onceCmd is a command that go-redis must never send again by itself.
type onceCmd struct{ *redis.Cmd }

// NoRetry tells go-redis not to resend the pipeline holding the command.
func (onceCmd) NoRetry() bool { return true }

// rerouted says whether err is Redis Cluster refusing a command because of
// where its slot is: owned elsewhere (MOVED), moving (ASK, TRYAGAIN), or
// served by nobody right now (CLUSTERDOWN). The command did not run; it
// may once the client follows the slot, or the cluster settles.
func rerouted(err error) bool {
	if isRedirect(err) {
		return true
	}
	return redis.IsTryAgainError(err) || redis.IsClusterDownError(err)
}

// aborted adds to an EXECABORT the refusal of the first queued command
// that Redis Cluster rerouted, or that a server taking no writes refused
// (see refusesWrites), if any, so that the caller sees why the
// transaction was discarded: EXECABORT alone also follows a malformed
// command, which no retry mends.
func aborted(err error, queued []redis.Cmder) error {
	if !redis.IsExecAbortError(err) {
		return err
	}
	for _, c := range queued {
		if cause := c.Err(); rerouted(cause) || refusesWrites(cause) {
			return fmt.Errorf("%w (queued: %w)", err, cause)
		}
	}
	return err
}

// waitArgs is the WAIT command for Options.MinReplicas.
func (s *Store) waitArgs() cmd {
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
	replies, err := txPipelinedDo(ctx, c, body)
	if err == nil && s.opts.MinReplicas > 0 {
		return replies, fmt.Errorf("%w: no WAIT through %T", errUnreplicated, c)
	}
	return replies, err
}

// txPipelinedDo runs body as one transaction through go-redis's
// TxPipelined, which routes it on any client, and returns EXEC's replies.
func txPipelinedDo(ctx context.Context, c redis.UniversalClient, body []cmd) ([]any, error) {
	cmds := make([]*redis.Cmd, len(body))
	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i, b := range body {
			cmds[i] = p.Do(ctx, b...)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		cmders := make([]redis.Cmder, len(cmds))
		for i, c := range cmds {
			cmders[i] = c
		}
		return nil, aborted(err, cmders)
	}
	replies := make([]any, len(cmds))
	for i, c := range cmds {
		replies[i] = c.Val()
	}
	return replies, nil
}
