package optimistic

import (
	"context"
	"errors"
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
	// conn is the connection's WATCH state, which outlives the transaction
	// when the connection is shared (see session).
	conn *session
	// peek makes an armed read send no WATCH: what it reads decides
	// nothing but whether to read again under WATCH.
	peek bool
}

// read sends WATCH (when armed here, unless peek) and the reads queued by
// fn in one round trip. On a shared connection still watching an earlier
// transaction's keys, UNWATCH goes first in that same round trip.
func (t *txn) read(ctx context.Context, fn func(p redis.Pipeliner)) error {
	var unwatch redis.Cmder
	cmds, err := t.tx.Pipelined(ctx, func(p redis.Pipeliner) error {
		if t.arm != nil {
			if t.conn.watching {
				unwatch = p.Do(ctx, "unwatch")
			}
			if !t.peek {
				args := make([]any, 0, len(t.arm)+1)
				args = append(args, "watch")
				for _, k := range t.arm {
					args = append(args, k)
				}
				t.conn.watching = true
				p.Do(ctx, args...)
			}
		}
		fn(p)
		return nil
	})
	if t.peek && unwatch != nil && unwatch.Err() == nil {
		t.conn.watching = false
	}
	if unwatch == nil || err == nil {
		return err
	}
	// A refused UNWATCH leaves the earlier keys watched too: at worst EXEC
	// aborts for nothing, and the session's end retires the connection.
	for _, c := range cmds {
		if c != unwatch && c.Err() != nil {
			return c.Err()
		}
	}
	return nil
}

// widen watches key too, from the next read on: a read then sends
// UNWATCH and WATCH of every key, and reads them all again.
func (t *txn) widen(ctx context.Context, key string) error {
	if t.arm == nil {
		return t.tx.Watch(ctx, key).Err()
	}
	t.arm = append(t.arm[:len(t.arm):len(t.arm)], key)
	return nil
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
	if ran {
		t.conn.watching = false
	}
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
	var own conns
	defer own.end(ctx)
	return s.watchOn(ctx, &own, keys, fn)
}

// watchOn is watch on conns' connection to the keys' server, which
// outlives the transaction (see session).
func (s *Store) watchOn(ctx context.Context, conns *conns, keys []string, fn func(*txn) error) error {
	switch c := s.rdb.(type) {
	case *redis.Client:
		return conflict(s.armedWatch(ctx, conns, c, keys, fn))
	case *redis.ClusterClient:
		node, err := c.MasterForKey(ctx, keys[0])
		if err != nil {
			return err
		}
		err = s.armedWatch(ctx, conns, node, keys, fn)
		if _, moved := redis.IsMovedError(err); !moved || errors.Is(err, ErrConflict) {
			// A commit refused by a moved slot is a conflict like any
			// other (counted, retried); only a refused read falls back.
			return conflict(err)
		}
		c.ReloadState(ctx)
	}
	return conflict(s.rdb.Watch(ctx, func(tx *redis.Tx) error {
		// go-redis sent the WATCH; unless EXEC clears it, it is released
		// here, even after ctx ended (see unwatch).
		t := &txn{s: s, tx: tx, conn: &session{watching: true}}
		err := fn(t)
		if t.conn.watching {
			unwatch(ctx, tx)
		}
		return err
	}, keys...))
}

// armedWatch runs fn on a transaction on conns' connection to node that
// WATCHes keys in its first pipeline. go-redis does not know about that
// WATCH: the session releases it. A transaction that failed otherwise than
// by a conflict may have left the connection broken, so it is given back.
func (s *Store) armedWatch(ctx context.Context, conns *conns, node *redis.Client, keys []string, fn func(*txn) error) error {
	se := conns.on(ctx, node)
	err := fn(&txn{s: s, tx: se.tx, arm: keys, conn: se})
	if err != nil && !errors.Is(conflict(err), ErrConflict) {
		conns.end(ctx)
	}
	return err
}

// conns holds the session of one Allocate pass: transactions on
// consecutive candidates of one server share its connection. It is used
// by one goroutine only; the zero value holds none.
type conns struct{ cur *session }

// on returns the session on node, ending one on another server first.
func (c *conns) on(ctx context.Context, node *redis.Client) *session {
	if c.cur != nil && c.cur.node != node {
		c.end(ctx)
	}
	if c.cur == nil {
		c.cur = open(ctx, node)
	}
	return c.cur
}

// end ends the session held, if any (see session.end).
func (c *conns) end(ctx context.Context) {
	if c.cur != nil {
		c.cur.end(ctx)
		c.cur = nil
	}
}

// session is one pooled connection that transactions share, one after
// the other, so that a candidate skipped after its read costs no UNWATCH
// of its own: the next read on the connection sends it first, in its own
// round trip (see txn.read), and the session's end sends one only if a
// WATCH is still live then. The connection never goes back to the pool
// watching; Allocate gives it back before it waits for a gate (see try).
// A session is used by one call, one transaction at a time.
type session struct {
	node *redis.Client
	tx   *redis.Tx
	// watching says a WATCH may be live on tx: none since the last EXEC
	// or UNWATCH.
	watching bool
	done     chan struct{} // closed by end: go-redis may close tx
	closed   chan struct{} // closed once go-redis closed tx
}

// open starts a session on node. go-redis hands a Tx (which takes a pooled
// connection at its first command, and clones the client's options, which
// Client.Conn does not: a data race on the first dials) only to a Watch
// callback, which runs fn at once when given no keys: a goroutine keeps
// that callback open until end. The channels order every use of tx by the
// session's holder before go-redis closes it.
func open(ctx context.Context, node *redis.Client) *session {
	se := &session{node: node, done: make(chan struct{}), closed: make(chan struct{})}
	txs := make(chan *redis.Tx)
	go func() {
		defer close(se.closed)
		_ = node.Watch(context.WithoutCancel(ctx), func(tx *redis.Tx) error {
			txs <- tx
			<-se.done
			return nil
		})
	}()
	se.tx = <-txs
	return se
}

// end releases a WATCH still live (see unwatch) and gives the connection
// back to the pool.
func (se *session) end(ctx context.Context) {
	if se.watching {
		unwatch(ctx, se.tx)
		se.watching = false
	}
	close(se.done)
	<-se.closed
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

// enter takes keyID's gate (see keygate): one allocation (or admin drop)
// per credential at a time in this process. Allocations of one process
// that pile onto a hot key would otherwise abort each other's EXECs;
// queued here they commit in turn, and what still aborts them is other
// processes and releases, renewals and syncs, which do not queue. If wait
// is false and the gate is taken, it returns errGateBusy at once. Waiting
// holds no pooled connection and ends with ctx. With Options.NoGate every
// call goes straight through.
func (s *Store) enter(ctx context.Context, keyID string, wait bool) (release func(), err error) {
	switch {
	case s.opts.NoGate:
		return func() {}, nil
	case wait:
		return s.gates.Enter(ctx, keyID)
	}
	if release, ok := s.gates.TryEnter(keyID); ok {
		return release, nil
	}
	return nil, errGateBusy
}
