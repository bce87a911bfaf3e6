package optimistic

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// txn is one optimistic transaction on the connection that owns its keys.
// It is used by one goroutine only.
type txn struct {
	s  *Store
	tx *redis.Tx
	// arm lists the keys to WATCH in the first read pipeline; nil when
	// go-redis already sent WATCH (and so must see the EXEC, see commit).
	arm []string
	// cleared is set once EXEC ran, which drops the watch server-side.
	cleared bool
}

// read sends WATCH (when armed here) and the reads queued by fn in one round
// trip.
func (t *txn) read(ctx context.Context, fn func(p redis.Pipeliner)) error {
	_, err := t.tx.Pipelined(ctx, func(p redis.Pipeliner) error {
		if t.arm != nil {
			args := make([]any, 0, len(t.arm)+1)
			args = append(args, "watch")
			for _, k := range t.arm {
				args = append(args, k)
			}
			p.Do(ctx, args...)
		}
		fn(p)
		return nil
	})
	return err
}

// commit sends MULTI, body and EXEC (and WAIT, see Store.multi) in one
// round trip. It returns an ErrConflict if a watched key changed since
// read. When go-redis sent the WATCH, the transaction goes through its
// TxPipelined instead (see Store.txPipelined), so that go-redis knows
// EXEC dropped the watch and does not send UNWATCH again on closing.
func (t *txn) commit(ctx context.Context, body []cmd) error {
	var (
		ran bool
		err error
	)
	if t.arm == nil {
		ran, err = t.s.txPipelined(ctx, t.tx, body)
	} else {
		_, ran, err = t.s.multi(ctx, t.tx, body)
	}
	// On other errors the connection is either broken (and dropped) or
	// still watching.
	t.cleared = ran
	return conflict(err)
}

// watch runs fn in a transaction watching keys (all in one slot). The
// caller holds the credential's gate.
//
// go-redis's Watch(ctx, fn, keys...) sends WATCH in a round trip of its own.
// For standalone, Sentinel and Cluster clients we send WATCH in the same
// pipeline as TIME and the reads instead: two round trips per uncontended
// attempt. Other clients (Ring, wrappers), and a cluster slot that moved
// before the reads (MOVED), fall back to go-redis's Watch, which follows
// redirects of the WATCH itself and runs fn at most once. fn still only
// reads, decides and commits, assigning its own results: retries are the
// caller's loop.
//
// A slot that is moving (ASK, TRYAGAIN), or a cluster that cannot serve
// it (CLUSTERDOWN), fails the attempt as a conflict (see conflict): a
// credential's keys may be split between two nodes until the move ends,
// and no transaction can span them.
func (s *Store) watch(ctx context.Context, keys []string, fn func(*txn) error) error {
	switch c := s.rdb.(type) {
	case *redis.Client:
		return conflict(s.armedWatch(ctx, c, keys, fn))
	case *redis.ClusterClient:
		node, err := c.MasterForKey(ctx, keys[0])
		if err != nil {
			return err
		}
		err = s.armedWatch(ctx, node, keys, fn)
		if _, moved := redis.IsMovedError(err); !moved || errors.Is(err, ErrConflict) {
			// A commit refused by a moved slot is a conflict like any
			// other (counted, retried); only a refused read falls back.
			return conflict(err)
		}
		c.ReloadState(ctx)
	}
	return conflict(s.rdb.Watch(ctx, func(tx *redis.Tx) error { return s.run(ctx, tx, nil, fn) }, keys...))
}

// armedWatch runs fn on a fresh transaction that WATCHes keys in its first
// pipeline. go-redis does not know about that WATCH, so run releases it.
func (s *Store) armedWatch(ctx context.Context, c *redis.Client, keys []string, fn func(*txn) error) error {
	return c.Watch(ctx, func(tx *redis.Tx) error { return s.run(ctx, tx, keys, fn) })
}

// run runs fn on tx and, if no EXEC cleared the watch, releases it.
func (s *Store) run(ctx context.Context, tx *redis.Tx, arm []string, fn func(*txn) error) error {
	t := &txn{s: s, tx: tx, arm: arm}
	err := fn(t)
	if !t.cleared {
		unwatch(ctx, tx)
	}
	return err
}

// unwatchTimeout bounds the UNWATCH sent after the caller's ctx ended.
const unwatchTimeout = time.Second

// unwatch releases a WATCH that no EXEC cleared, even after ctx ended (a
// cancelled ctx would stop go-redis before it sends anything): a watching
// connection back in the pool would abort some later caller's EXEC.
// go-redis drops a connection whose UNWATCH failed on the network; one
// whose UNWATCH the server refused is told to QUIT, and then pinged: the
// server has closed it, so the ping fails on the network and go-redis
// drops the connection before it goes back to the pool.
func unwatch(ctx context.Context, tx *redis.Tx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unwatchTimeout)
	defer cancel()
	var refused redis.Error
	if err := tx.Unwatch(ctx).Err(); errors.As(err, &refused) {
		_ = tx.Do(ctx, "quit").Err()
		_ = tx.Ping(ctx).Err()
	}
}

func isRedirect(err error) bool {
	if _, ok := redis.IsMovedError(err); ok {
		return true
	}
	_, ok := redis.IsAskError(err)
	return ok
}

// owner returns the client to send key's commands to: on a cluster, the
// master of key's slot, so that TIME in the same pipeline is that node's
// clock, the one Allocate and Renew judge the key's leases by.
func (s *Store) owner(ctx context.Context, key string) (redis.UniversalClient, error) {
	if c, ok := s.rdb.(*redis.ClusterClient); ok {
		return c.MasterForKey(ctx, key)
	}
	return s.rdb, nil
}

// errGateBusy says another call of this process holds the key's gate.
var errGateBusy = errors.New("optimistic: key busy in this process")

// gates holds each credential's turn in this process (see enter). A gate
// lives only while someone holds or waits for it, so the map never outgrows
// the keys in use, and a deleted key leaves nothing behind.
type gates struct {
	mu sync.Mutex
	m  map[string]*gate
}

type gate struct {
	turn chan struct{} // capacity 1: full while held
	refs int           // holders and waiters, guarded by gates.mu
}

func (g *gates) ref(keyID string) *gate {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil {
		g.m = make(map[string]*gate)
	}
	gt := g.m[keyID]
	if gt == nil {
		gt = &gate{turn: make(chan struct{}, 1)}
		g.m[keyID] = gt
	}
	gt.refs++
	return gt
}

func (g *gates) unref(keyID string, gt *gate) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gt.refs--; gt.refs == 0 {
		delete(g.m, keyID)
	}
}

// enter takes keyID's gate: one allocation (or admin drop) per credential
// at a time in this process. Allocations of one process that pile onto a
// hot key would otherwise abort each other's EXECs; queued here they
// commit in turn, and what still aborts them is other processes and
// releases, renewals and syncs, which do not queue. If wait is false and
// the gate is taken, it returns errGateBusy at once. Waiting holds no
// pooled connection and ends with ctx.
func (s *Store) enter(ctx context.Context, keyID string, wait bool) (release func(), err error) {
	gt := s.gates.ref(keyID)
	release = func() {
		<-gt.turn
		s.gates.unref(keyID, gt)
	}
	if !wait {
		select {
		case gt.turn <- struct{}{}:
			return release, nil
		default:
			s.gates.unref(keyID, gt)
			return nil, errGateBusy
		}
	}
	select {
	case gt.turn <- struct{}{}:
		return release, nil
	case <-ctx.Done():
		s.gates.unref(keyID, gt)
		return nil, ctx.Err()
	}
}
