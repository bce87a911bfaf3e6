package server

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/credpool/credpool/optimistic"
)

// nodeTimeout bounds one round of checks.
const nodeTimeout = time.Second

// nodeWatch checks that the lease store's servers (each master of a Redis
// Cluster; the SQLite file) take writes every so often, keeps the last
// answer for /readyz and the metrics, and logs a node going down, and
// coming back, once each.
type nodeWatch struct {
	store nodeChecker
	log   *slog.Logger

	mu   sync.Mutex
	last []optimistic.NodeHealth

	done, ended chan struct{}
	once        sync.Once
}

// nodeChecker is a lease store that checks its servers with a write:
// optimistic.Store, sqlitestore.Store.
type nodeChecker interface {
	Nodes(ctx context.Context) []optimistic.NodeHealth
}

// watchNodes checks the nodes once, then every every (DefaultClusterRefresh
// if not positive) until stop.
func watchNodes(s nodeChecker, every time.Duration, log *slog.Logger) *nodeWatch {
	if every <= 0 {
		every = DefaultClusterRefresh
	}
	w := &nodeWatch{store: s, log: log, done: make(chan struct{}), ended: make(chan struct{})}
	w.check()
	go func() {
		defer close(w.ended)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-w.done:
				return
			case <-tick.C:
				w.check()
			}
		}
	}()
	return w
}

func (w *nodeWatch) check() {
	ctx, cancel := context.WithTimeout(context.Background(), nodeTimeout)
	defer cancel()
	nodes := w.store.Nodes(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	// Compared with the last check only: a node that left the list (a dead
	// master replaced by its replica) is forgotten, and logged again if it
	// comes back down.
	wasDown := make(map[string]bool, len(w.last))
	for _, n := range w.last {
		wasDown[n.Addr] = n.Err != nil
	}
	for _, n := range nodes {
		switch {
		case n.Err != nil && !wasDown[n.Addr]:
			w.log.Warn("lease store node down or refusing writes: no grant on its keys until it takes writes", "node", n.Addr, "err", n.Err)
		case n.Err == nil && wasDown[n.Addr]:
			w.log.Info("lease store node takes writes again", "node", n.Addr)
		}
	}
	w.last = nodes
}

// Nodes is the last check's answer.
func (w *nodeWatch) Nodes() []optimistic.NodeHealth {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// stop ends the checks; it is safe to call more than once.
func (w *nodeWatch) stop() {
	w.once.Do(func() { close(w.done) })
	<-w.ended
}
