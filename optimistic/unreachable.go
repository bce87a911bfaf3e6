package optimistic

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// unreachable reports whether err means the server holding a key did not
// answer at all: a refused, reset or broken connection, a network
// timeout, or no pooled connection in time. A Redis reply (an error
// reply, MOVED), the caller's ctx ending, a closed client and the store's
// own outcomes are not. On Redis Cluster such a key's master may be down
// while the others answer, so Allocate skips the key and Inspect marks it
// (KeyInfo.Unreachable) instead of failing the whole call.
func unreachable(ctx context.Context, err error) bool {
	var reply redis.Error
	switch {
	case err == nil, ctx.Err() != nil, errors.As(err, &reply), errors.Is(err, redis.ErrClosed),
		errors.Is(err, ErrConflict), errors.Is(err, errRecheck), errors.Is(err, ErrInvalid):
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, redis.ErrPoolTimeout)
}
