package optimistic

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// coalesceTimeout bounds the wait for a connection and its dial for
	// one pipeline of coalesced transactions (and its I/O, on a client
	// with ContextTimeoutEnabled; else the client's read and write
	// timeouts bound that). It serves several callers, so no one caller's
	// ctx cuts it short.
	coalesceTimeout = 5 * time.Second
	// maxCoalesced bounds the transactions one pipeline carries, so that
	// a burst does not share one failure.
	maxCoalesced = 256
)

// coalescer sends the unwatched transactions (releases) of concurrent
// callers to one server together: while one pipeline is on the wire, the
// transactions that arrive queue, and the next pipeline carries them all.
// A caller alone has its own sent at once; under load, many releases share
// one write and one read, on the client and on the server, instead of a
// round trip each. Only transactions that watch nothing may share a
// connection so; each is still one MULTI…EXEC, applied by the server on
// its own. It is safe for concurrent use.
type coalescer struct {
	mu sync.Mutex
	// queues holds each server's transactions waiting for the next
	// pipeline. A server has an entry (empty, too, while its pipeline is
	// on the wire) exactly while a goroutine sends for it.
	queues map[*redis.Client][]*queuedTx
}

type queuedTx struct {
	txCall
	// settled runs in the sending goroutine once the outcome is known,
	// even if the caller has gone, with then's reply too.
	settled func(replies []any, then any, err error)
	replies []any
	err     error
	done    chan struct{}
}

// do runs body as one MULTI…EXEC on c, followed by then (unless nil) in
// the same round trip, in a pipeline shared with other callers', and
// returns EXEC's replies as multi does; settled (unless nil) runs with
// them, and then's reply (nil if none), first. If ctx ends first, do
// returns ctx's error at once: the transaction may still run, and
// settled still runs.
//
// A pipeline is never sent twice (see onceCmd): when the network fails
// it, every transaction in it fails, whether or not the server ran it.
func (co *coalescer) do(ctx context.Context, c *redis.Client, body []cmd, then cmd, settled func([]any, any, error)) ([]any, error) {
	call := &queuedTx{txCall: txCall{body: body, then: then}, settled: settled, done: make(chan struct{})}
	co.mu.Lock()
	if co.queues == nil {
		co.queues = make(map[*redis.Client][]*queuedTx)
	}
	queued, sending := co.queues[c]
	co.queues[c] = append(queued, call)
	co.mu.Unlock()
	if !sending {
		go co.drain(c)
	}
	select {
	case <-call.done:
	case <-ctx.Done():
		select {
		case <-call.done:
		default:
			return nil, ctx.Err()
		}
	}
	return call.replies, call.err
}

// drain sends c's queued transactions until none is left.
func (co *coalescer) drain(c *redis.Client) {
	for co.send(c) {
	}
}

// send takes up to maxCoalesced of c's queued transactions, runs them in
// one pipeline, hands each its outcome, and says whether more are queued;
// if not, c's entry goes (nothing stays behind for a server no longer
// used), and the next caller starts a sender again.
func (co *coalescer) send(c *redis.Client) (more bool) {
	co.mu.Lock()
	queued := co.queues[c]
	n := min(len(queued), maxCoalesced)
	calls := queued[:n:n]
	co.queues[c] = queued[n:]
	co.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), coalesceTimeout)
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, call := range calls {
			call.queue(ctx, p)
		}
		return nil
	})
	cancel()
	for _, call := range calls {
		call.replies, _, call.err = call.result()
		if call.settled != nil {
			var then any
			if call.after != nil {
				then = call.after.Val()
			}
			call.settled(call.replies, then, call.err)
		}
		close(call.done)
	}
	co.mu.Lock()
	defer co.mu.Unlock()
	if len(co.queues[c]) > 0 {
		return true
	}
	delete(co.queues, c)
	return false
}
