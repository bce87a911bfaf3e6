package bench

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/credpool/credpool/internal/redisproc"
)

// setUp are the commands go-redis sends to set up a new connection (pub/sub
// ones too), through the client's hooks like any other. The stores never
// send them.
var setUp = map[string]bool{
	"hello": true, "auth": true, "select": true, "readonly": true,
	"client|setinfo": true, "client|setname": true, "client|tracking": true, "client|maint_notifications": true,
}

// isSetUp says whether every command of cmds sets up a connection.
func isSetUp(cmds ...redis.Cmder) bool {
	for _, cmd := range cmds {
		name := cmd.Name()
		if args := cmd.Args(); name == "client" && len(args) > 1 {
			name += "|" + strings.ToLower(fmt.Sprint(args[1]))
		}
		if !setUp[name] {
			return false
		}
	}
	return true
}

// countedRoundTrips hooks rt into a client, leaving out the round trips
// that set up a connection: a run that opens connections would otherwise
// pay a few requests for each.
type countedRoundTrips struct{ rt *redisproc.RoundTrips }

// DialHook counts nothing, as rt's.
func (c countedRoundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook counts a lone command, but for a connection's set-up.
func (c countedRoundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	counted := c.rt.ProcessHook(next)
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isSetUp(cmd) {
			return next(ctx, cmd)
		}
		return counted(ctx, cmd)
	}
}

// ProcessPipelineHook counts a pipeline or transaction, but for a
// connection's set-up.
func (c countedRoundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	counted := c.rt.ProcessPipelineHook(next)
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if isSetUp(cmds...) {
			return next(ctx, cmds)
		}
		return counted(ctx, cmds)
	}
}
