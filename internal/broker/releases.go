package broker

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"

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
	// released, if set, is told the key of each release the store took.
	released func(keyID string)
	// turn holds a token while a round runs: one at a time, so no release
	// is sent twice and counted twice.
	turn chan struct{}

	// answered is counts.Released+Lost, kept apart as an atomic: every
	// allocate reads it (see settled), and mu is not for the hot path.
	answered atomic.Int64

	mu      sync.Mutex
	pending map[string]map[string]optimistic.LeaseRef // by key id, then lease id
	counts  Backlog                                   // Pending included
	closed  bool
	stop    context.CancelFunc // ends the retry loop; nil while none runs
	done    chan struct{}      // closed when that loop has ended
}

func newBacklog(s optimistic.LeaseStore, log *slog.Logger) *backlog {
	return &backlog{
		store: s, log: log, turn: make(chan struct{}, 1),
		pending: map[string]map[string]optimistic.LeaseRef{},
	}
}

// add keeps ref for retrying and starts the retry loop if it is not running.
func (q *backlog) add(ref optimistic.LeaseRef) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.pending[ref.KeyID][ref.LeaseID]; ok {
		return
	}
	if q.closed || q.counts.Pending >= maxBacklog {
		q.counts.Dropped++
		why := "release backlog full"
		if q.closed {
			why = "release backlog closed"
		}
		q.log.Warn(why+": the lease will expire by itself", "key_id", ref.KeyID, "lease_id", ref.LeaseID)
		return
	}
	if q.pending[ref.KeyID] == nil {
		q.pending[ref.KeyID] = map[string]optimistic.LeaseRef{}
	}
	q.pending[ref.KeyID][ref.LeaseID] = ref
	q.counts.Pending++
	if q.stop == nil {
		ctx, cancel := context.WithCancel(context.Background())
		q.stop, q.done = cancel, make(chan struct{})
		go q.loop(ctx, q.done)
	}
}

// settled returns how many releases the store has answered since start:
// one read before asking the store and one after a round tell whether
// any round, the background's too, freed something meanwhile.
func (q *backlog) settled() int64 { return q.answered.Load() }

// stuck reports how many releases on the given keys wait for the store.
func (q *backlog) stuck(keyIDs ...string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, id := range keyIDs {
		n += len(q.pending[id])
	}
	return n
}

func (q *backlog) stats() Backlog {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.counts
}

// loop retries every pending release, pausing longer while the store keeps
// failing, until none is left or close cancels ctx.
func (q *backlog) loop(ctx context.Context, done chan struct{}) {
	defer close(done)
	// Built here, not shared: an ExponentialBackOff is not safe for
	// concurrent use. It never gives up: the loop ends when the backlog is
	// empty or closed, and maxBacklog bounds it.
	pauses := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(minRetryPause),
		backoff.WithMaxInterval(maxRetryPause),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0.5),
		backoff.WithMaxElapsedTime(0),
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(pauses.NextBackOff()):
		}
		if q.round(ctx) > 0 {
			pauses.Reset()
		}
		q.mu.Lock()
		if q.counts.Pending == 0 {
			// add starts a new loop for the next failure.
			q.stop()
			q.stop, q.done = nil, nil
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
	}
}

// round tries the pending releases (of keyIDs only, if given) and returns
// how many the store answered. While another round runs it returns 0 at
// once: waiting would queue callers behind a store that may hang.
func (q *backlog) round(ctx context.Context, keyIDs ...string) int {
	select {
	case q.turn <- struct{}{}:
	default:
		return 0
	}
	defer func() { <-q.turn }()
	return q.retry(ctx, keyIDs)
}

// nodes is a lease store whose keys live on several servers that fail
// apart (the Redis store on a Redis Cluster): Node names the one holding
// a key.
type nodes interface {
	Node(ctx context.Context, keyID string) (string, error)
}

// retry is one round; the caller holds the turn. It returns how many
// releases the store answered. The releases go server by server (see
// nodes; every key is on the one server of any other store), the servers
// concurrently, and each server's stop at its first failure: it is still
// down, and trying the rest of its releases would only keep the round
// (and a shutdown, or a caller) waiting, a timeout each if it is silent.
// So one dead Redis Cluster master holds up no release on the others.
func (q *backlog) retry(ctx context.Context, keyIDs []string) int {
	q.mu.Lock()
	var ids []string
	for id := range q.pending {
		if len(keyIDs) == 0 || slices.Contains(keyIDs, id) {
			ids = append(ids, id)
		}
	}
	q.mu.Unlock()
	byNode := map[string][]string{}
	locate, ok := q.store.(nodes)
	for _, id := range ids {
		node := ""
		if ok {
			var err error
			if node, err = locate.Node(ctx, id); err != nil {
				// Nobody knows where: together, one after another.
				node = "unknown"
			}
		}
		byNode[node] = append(byNode[node], id)
	}
	var (
		answered atomic.Int64
		wg       sync.WaitGroup
	)
	for _, ids := range byNode {
		wg.Go(func() {
			for _, id := range ids {
				q.mu.Lock()
				refs := slices.Collect(maps.Values(q.pending[id]))
				q.mu.Unlock()
				for _, ref := range refs {
					if err := q.retryOne(ctx, ref); err != nil {
						return
					}
					answered.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return int(answered.Load())
}

// retryOne sends one pending release again and, if the store answered,
// takes it off the backlog.
func (q *backlog) retryOne(ctx context.Context, ref optimistic.LeaseRef) error {
	actx, cancel := context.WithTimeout(ctx, retryTimeout)
	err := q.store.Release(actx, ref)
	cancel()
	lost := errors.Is(err, optimistic.ErrLeaseLost)
	if err != nil && !lost {
		return err
	}
	if err == nil && q.released != nil {
		q.released(ref.KeyID)
	}
	q.settle(ref, lost)
	return nil
}

// settle takes a release the store answered off the backlog and counts it.
func (q *backlog) settle(ref optimistic.LeaseRef, lost bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	leases := q.pending[ref.KeyID]
	if _, ok := leases[ref.LeaseID]; !ok {
		return
	}
	delete(leases, ref.LeaseID)
	if len(leases) == 0 {
		delete(q.pending, ref.KeyID)
	}
	q.counts.Pending--
	q.answered.Add(1)
	if lost {
		q.counts.Lost++
	} else {
		q.counts.Released++
	}
	q.log.Info("release retried", "key_id", ref.KeyID, "lease_id", ref.LeaseID, "released", !lost)
}

// close stops the loop and makes one last round under ctx: a graceful
// shutdown gives back what the store takes, within ctx. It returns when
// ctx ends, even if the store hangs a round.
func (q *backlog) close(ctx context.Context) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	q.closed = true
	stop, done := q.stop, q.done
	q.mu.Unlock()
	if stop != nil {
		stop() // a round under way ends with its releases' ctx
		select {
		case <-done:
		case <-ctx.Done():
			return
		}
	}
	select {
	case q.turn <- struct{}{}:
		defer func() { <-q.turn }()
		q.retry(ctx, nil)
	case <-ctx.Done():
	}
}
