package server

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultClusterRefresh is how often a cluster client reloads its slot map
// unless Config.RedisClusterRefresh says otherwise. go-redis alone reloads
// it every minute or on a redirection, but a master that died answers
// nothing, redirects nobody, and would keep its slots in the client's map
// for up to a minute after its replica took over.
const DefaultClusterRefresh = time.Second

// KeepTopology keeps c's slot map fresh until the returned stop is called:
// it reloads it every every (DefaultClusterRefresh if not positive), and
// as soon as a node fails on the network (a refused or broken connection,
// a timeout) rather than answering. go-redis runs one reload at a time and
// at most one more within 200ms, so a burst of failures costs a few
// CLUSTER SLOTS, not one each. Call it before c's first command: the hook
// goes on node clients as c creates them. stop waits for the ticker to end
// and is safe to call more than once; c stays open.
func KeepTopology(c *redis.ClusterClient, every time.Duration) (stop func()) {
	if every <= 0 {
		every = DefaultClusterRefresh
	}
	c.OnNewNode(func(node *redis.Client) { node.AddHook(reloadOnNetError{c}) })
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				c.ReloadState(context.Background())
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		<-ended
	}
}

// reloadOnNetError is a hook on each node client of a cluster client that
// asks for a slot map reload when a command to the node fails without an
// answer from Redis.
type reloadOnNetError struct{ c *redis.ClusterClient }

func (h reloadOnNetError) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h reloadOnNetError) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		// The reload's own CLUSTER SLOTS to a dead node must not ask for
		// yet another reload.
		if cmd.Name() != "cluster" {
			h.check(err)
		}
		return err
	}
}

func (h reloadOnNetError) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.check(err)
		return err
	}
}

// check asks for a reload if err is a failure to reach the node: not a
// reply of Redis (MOVED and ASK are go-redis's own business), not the
// caller giving up, not the client being closed.
func (h reloadOnNetError) check(err error) {
	var reply redis.Error
	switch {
	case err == nil, errors.As(err, &reply), errors.Is(err, context.Canceled),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, redis.ErrClosed):
		return
	}
	h.c.ReloadState(context.Background())
}
