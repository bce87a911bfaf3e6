package broker

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/credpool/credpool/optimistic"
)

// Bounds of the release backlog.
const (
	// maxBacklog bounds the releases kept for retrying; beyond it a failed
	// release is dropped (counted) and its lease expires by itself.
	maxBacklog = 10_000
	// Pauses between rounds while the store keeps failing: from the first
	// to the last, doubling, with ±50% jitter.
	minRetryPause = 100 * time.Millisecond
	maxRetryPause = 5 * time.Second
	// retryTimeout bounds one release attempt.
	retryTimeout = 2 * time.Second
)

// Backlog counts the releases that met a store failure and are retried in
// the background.
type Backlog struct {
	// Pending is the number waiting for the store now.
	Pending int
	// Released, Lost and Dropped count, since start, those the store
	// finally released, those it no longer held (expired or released
	// meanwhile) and those over the bound, left to expire.
	Released, Lost, Dropped int64
}

// backlog retries, in the background, releases that met a store failure,
// so their slots come back as soon as the store does instead of at their
// leases' expiry. It lives in memory: a crash, or more than maxBacklog
// failures at once, leaves those leases to expire by themselves. It is
// safe for concurrent use.
type backlog struct {
	store optimistic.LeaseStore
	log   *slog.Logger

	mu      sync.Mutex
	pending map[string]optimistic.LeaseRef // by lease id
	perKey  map[string]int                 // pending releases per key id
	counts  Backlog
	running bool          // a retry loop is running
	done    chan struct{} // closed when that loop ends
	closed  bool          // close was called
	stop    chan struct{} // closed by close
}

func newBacklog(s optimistic.LeaseStore, log *slog.Logger) *backlog {
	return &backlog{
		store: s, log: log,
		pending: map[string]optimistic.LeaseRef{}, perKey: map[string]int{},
		stop: make(chan struct{}),
	}
}

// add keeps ref for retrying and starts the retry loop if it is not running.
func (q *backlog) add(ref optimistic.LeaseRef) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.pending[ref.LeaseID]; ok {
		return
	}
	if q.closed || len(q.pending) >= maxBacklog {
		q.counts.Dropped++
		why := "release backlog full"
		if q.closed {
			why = "release backlog closed"
		}
		q.log.Warn(why+": the lease will expire by itself", "key_id", ref.KeyID, "lease_id", ref.LeaseID)
		return
	}
	q.pending[ref.LeaseID] = ref
	q.perKey[ref.KeyID]++
	if !q.running {
		q.running, q.done = true, make(chan struct{})
		go q.loop(q.done)
	}
}

// stuck reports how many releases on the given keys wait for the store.
func (q *backlog) stuck(keyIDs ...string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, id := range keyIDs {
		n += q.perKey[id]
	}
	return n
}

func (q *backlog) stats() Backlog {
	q.mu.Lock()
	defer q.mu.Unlock()
	c := q.counts
	c.Pending = len(q.pending)
	return c
}

// loop retries every pending release, pausing longer while the store keeps
// failing, until none is left or Close.
func (q *backlog) loop(done chan struct{}) {
	defer close(done)
	// A round in progress ends with close, which makes its own last one.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-q.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	pause := minRetryPause
	for {
		jittered := time.Duration(float64(pause) * (0.5 + rand.Float64()))
		select {
		case <-q.stop:
			return
		case <-time.After(jittered):
		}
		if q.round(ctx) {
			pause = minRetryPause
		} else {
			pause = min(2*pause, maxRetryPause)
		}
		q.mu.Lock()
		if len(q.pending) == 0 {
			// add starts a new loop for the next failure.
			q.running = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
	}
}

// round tries the pending releases (of keyIDs only, if given) and reports
// whether the store answered them all. It stops at the first failure: the
// store is still down, and trying the rest would only keep the round (and
// a shutdown, or a caller) waiting.
func (q *backlog) round(ctx context.Context, keyIDs ...string) bool {
	q.mu.Lock()
	refs := make([]optimistic.LeaseRef, 0, len(q.pending))
	for _, ref := range q.pending {
		if len(keyIDs) == 0 || slices.Contains(keyIDs, ref.KeyID) {
			refs = append(refs, ref)
		}
	}
	q.mu.Unlock()
	for _, ref := range refs {
		actx, cancel := context.WithTimeout(ctx, retryTimeout)
		err := q.store.Release(actx, ref)
		cancel()
		lost := errors.Is(err, optimistic.ErrLeaseLost)
		if err != nil && !lost {
			return false
		}
		q.mu.Lock()
		delete(q.pending, ref.LeaseID)
		if q.perKey[ref.KeyID]--; q.perKey[ref.KeyID] <= 0 {
			delete(q.perKey, ref.KeyID)
		}
		if lost {
			q.counts.Lost++
		} else {
			q.counts.Released++
		}
		q.mu.Unlock()
		q.log.Info("release retried", "key_id", ref.KeyID, "lease_id", ref.LeaseID, "released", !lost)
	}
	return true
}

// close stops the loop (a round under way ends at once) and makes one last
// round under ctx: a graceful shutdown gives back what the store takes,
// within ctx.
func (q *backlog) close(ctx context.Context) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	q.closed = true
	running, done := q.running, q.done
	close(q.stop)
	q.mu.Unlock()
	if running {
		<-done
	}
	q.round(ctx)
}
