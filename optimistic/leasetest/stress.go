package leasetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/optimistic"
)

// Stress hammers a fresh backend for about d with concurrent allocators,
// spread over its Store and peers, over several keys with random limits,
// hold times, renewals, releases and crashes (leases left to expire). Three independent checks: a live holder
// count per key never exceeds the limit; after the run, the hold intervals
// (grant to release, or to expiry for a crashed holder, so expired leases
// keep their slot until they really end) never overlap more than the limit;
// and a limit-1 key guards a read-then-write counter that must not lose an
// update. Fencing tokens must be unique per key.
func Stress(t *testing.T, newBackend Factory, d time.Duration) {
	b := newBackend(t)
	procs := stores(t, b)
	rng := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	const nKeys = 4
	ids := make([]string, nKeys)
	limits := make(map[string]int, nKeys)
	for i := range ids {
		ids[i] = fmt.Sprintf("hot-%d", i)
		limits[ids[i]] = 1 + rng.IntN(4)
		syncKeys(t, b, key(ids[i], limits[ids[i]]))
	}
	syncKeys(t, b, key("mutex", 1))

	var (
		holders  = make(map[string]*atomic.Int64, nKeys)
		grants   = make(map[string]*atomic.Int64, nKeys)
		counter  atomic.Int64 // incremented by read, pause, write: only a lease makes it safe
		mutexOps atomic.Int64
		wg       sync.WaitGroup
		errs     = make(chan error, 64)
		deadline = time.Now().Add(d)
		holds    = holdLog{byKey: map[string][]hold{}}
	)
	for _, id := range ids {
		holders[id], grants[id] = new(atomic.Int64), new(atomic.Int64)
	}
	report := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	// Each worker keeps to one store, as a caller keeps to its process.
	worker := func(s optimistic.LeaseStore, seed uint64) {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(seed, seed))
		for time.Now().Before(deadline) {
			order := append([]string(nil), ids...)
			rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			crash := rng.IntN(5) == 0
			ttl := 5 * time.Second
			if crash {
				ttl = time.Duration(50+rng.IntN(100)) * time.Millisecond
			}
			l, err := allocateOn(s, ttl, order[:1+rng.IntN(len(order))]...)
			if errors.Is(err, optimistic.ErrNoCapacity) || errors.Is(err, optimistic.ErrContended) {
				continue
			}
			if err != nil {
				report(fmt.Errorf("allocate: %w", err))
				return
			}
			grants[l.KeyID].Add(1)
			if n := holders[l.KeyID].Add(1); n > int64(limits[l.KeyID]) {
				report(fmt.Errorf("oversold: %d holders of %s, limit %d", n, l.KeyID, limits[l.KeyID]))
			}
			// The store granted at its now, Until-ttl.
			start := l.Until.Add(-ttl)
			if crash {
				// The holder dies: it stops using the key at once, but the
				// store keeps the slot until the lease expires.
				holders[l.KeyID].Add(-1)
				holds.add(l, start, l.Until)
				continue
			}
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
			if rng.IntN(4) == 0 {
				if _, err := s.Renew(context.Background(), l.LeaseRef, ttl); err != nil {
					report(fmt.Errorf("renew a live lease: %w", err))
				}
			}
			holders[l.KeyID].Add(-1)
			holds.add(l, start, time.Now())
			if err := s.Release(context.Background(), l.LeaseRef); err != nil {
				report(fmt.Errorf("release a live lease: %w", err))
			}
		}
	}
	mutexWorker := func(s optimistic.LeaseStore) {
		defer wg.Done()
		for time.Now().Before(deadline) {
			l, err := allocateOn(s, 5*time.Second, "mutex")
			if errors.Is(err, optimistic.ErrNoCapacity) || errors.Is(err, optimistic.ErrContended) {
				runtime.Gosched()
				continue
			}
			if err != nil {
				report(fmt.Errorf("allocate mutex: %w", err))
				return
			}
			// A non-atomic increment: two overlapping holders lose one.
			v := counter.Load()
			runtime.Gosched()
			counter.Store(v + 1)
			mutexOps.Add(1)
			if err := s.Release(context.Background(), l.LeaseRef); err != nil {
				report(fmt.Errorf("release mutex: %w", err))
			}
		}
	}
	for i := range 16 {
		wg.Add(1)
		go worker(procs[i%len(procs)], uint64(i)+rng.Uint64())
	}
	for i := range 6 {
		wg.Add(1)
		go mutexWorker(procs[i%len(procs)])
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.Equal(t, mutexOps.Load(), counter.Load(), "lost updates under the limit-1 lease")
	require.Positive(t, mutexOps.Load(), "the mutex key was never granted")
	for _, id := range ids {
		require.Positive(t, grants[id].Load(), "%s (limit %d) was never granted", id, limits[id])
		t.Logf("%s: limit %d, %d grants", id, limits[id], grants[id].Load())
		require.NoError(t, holds.check(id, limits[id]))
	}
	t.Logf("mutex: %d grants", mutexOps.Load())
	// Crashed leases expire by themselves: nothing stays held.
	time.Sleep(200 * time.Millisecond)
	infos, err := b.Store.Inspect(context.Background(), append(ids, "mutex")...)
	require.NoError(t, err)
	for _, in := range infos {
		require.Zero(t, in.Live, "%s still has live leases", in.ID)
	}
}

// hold is one lease's time in use, by the store's clock (the same host
// clock as the test's).
type hold struct {
	start, end time.Time
	fence      int64
}

// holdLog collects holds from many goroutines.
type holdLog struct {
	mu    sync.Mutex
	byKey map[string][]hold
}

func (h *holdLog) add(l optimistic.Lease, start, end time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.byKey[l.KeyID] = append(h.byKey[l.KeyID], hold{start: start, end: end, fence: l.Fence})
}

// check says whether more than limit holds of key ever overlapped, and
// whether a fencing token was handed out twice. A grant's start is the
// store's millisecond, truncated, so it is moved 1ms later to never look
// earlier than the release or expiry that freed its slot.
func (h *holdLog) check(key string, limit int) error {
	type event struct {
		at    time.Time
		delta int
	}
	var events []event
	fences := map[int64]bool{}
	for _, x := range h.byKey[key] {
		if fences[x.fence] {
			return fmt.Errorf("%s: fencing token %d handed out twice", key, x.fence)
		}
		fences[x.fence] = true
		events = append(events, event{x.start.Add(time.Millisecond), 1}, event{x.end, -1})
	}
	slices.SortFunc(events, func(a, b event) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // ends before starts at the same instant
	})
	n := 0
	for _, e := range events {
		if n += e.delta; n > limit {
			return fmt.Errorf("%s: %d holds overlap at %s, limit %d", key, n, e.at.Format(time.RFC3339Nano), limit)
		}
	}
	return nil
}
