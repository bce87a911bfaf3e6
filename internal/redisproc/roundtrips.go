package redisproc

import (
	"context"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// RoundTrips is a go-redis hook counting requests: lone commands and
// pipelines (a MULTI…EXEC included), each one round trip. Transactions
// created from the client inherit it. It is safe for concurrent use.
type RoundTrips struct {
	Commands  atomic.Int64
	Pipelines atomic.Int64
}

// Total is every round trip counted so far.
func (r *RoundTrips) Total() int64 { return r.Commands.Load() + r.Pipelines.Load() }

// Reset starts the counts again from zero.
func (r *RoundTrips) Reset() {
	r.Commands.Store(0)
	r.Pipelines.Store(0)
}

// DialHook counts nothing: dialing sends no command. go-redis sends a new
// connection's handshake (HELLO, CLIENT SETINFO, …) through ProcessHook
// and ProcessPipelineHook, so it is counted; the benchmark leaves it out
// (bench/roundtrips.go).
func (r *RoundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook counts a lone command.
func (r *RoundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.Commands.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts a pipeline or transaction.
func (r *RoundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.Pipelines.Add(1)
		return next(ctx, cmds)
	}
}
