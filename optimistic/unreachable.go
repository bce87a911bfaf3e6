package optimistic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// unreachable reports whether err means the server holding a key cannot
// serve it now: it did not answer at all (a refused, reset or broken
// connection, a network timeout, no pooled connection in time), Redis
// Cluster says that nobody serves the key's slot right now (CLUSTERDOWN),
// or it answered but takes no writes for now (see refusesWrites). Another Redis
// reply (an error reply, MOVED), the caller's ctx ending, a closed client
// and the store's own outcomes are not. On Redis Cluster such a key's
// master may be down while the others answer, so Allocate skips the key
// and Inspect marks it (KeyInfo.Unreachable) instead of failing the whole
// call.
func unreachable(ctx context.Context, err error) bool {
	var reply redis.Error
	switch {
	case err == nil, ctx.Err() != nil, errors.Is(err, redis.ErrClosed),
		errors.Is(err, ErrConflict), errors.Is(err, errRecheck), errors.Is(err, ErrInvalid):
		return false
	case redis.IsClusterDownError(err), refusesWrites(err):
		return true
	case errors.As(err, &reply):
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, redis.ErrPoolTimeout)
}

// partial reports whether err leaves the call's other keys usable: an
// unreachable server on a cluster. On any other client every key lives
// on the one server, so a failure is the whole store's.
func (s *Store) partial(ctx context.Context, err error) bool {
	return s.cluster && unreachable(ctx, err)
}

// markPartial wraps err in ErrUnreachable if it is partial, for callers
// that go on with the other keys.
func (s *Store) markPartial(ctx context.Context, err error) error {
	if s.partial(ctx, err) {
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	return err
}

// writeRefusals start the error replies of a Redis server that answers
// but takes no writes for now: a read-only replica, too few replicas for
// its min-replicas-to-write, maxmemory reached, a failed save (which
// refuses PING too).
var writeRefusals = []string{"READONLY ", "NOREPLICAS ", "OOM ", "MISCONF "}

// refusesWrites reports whether err holds such a reply anywhere in its
// tree: a transaction's EXECABORT carries its queued command's refusal
// beside it (see aborted), or within, when the server refused EXEC
// itself.
func refusesWrites(err error) bool {
	switch e := err.(type) {
	case redis.Error:
		msg := strings.TrimPrefix(e.Error(), "EXECABORT Transaction discarded because of: ")
		return slices.ContainsFunc(writeRefusals, func(p string) bool { return strings.HasPrefix(msg, p) })
	case interface{ Unwrap() []error }:
		return slices.ContainsFunc(e.Unwrap(), refusesWrites)
	case interface{ Unwrap() error }:
		return refusesWrites(e.Unwrap())
	}
	return false
}
