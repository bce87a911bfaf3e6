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
// hold times, renewals, releases and crashes (leases left to expire). Three
// independent checks: when a lease is granted, the key's other leases in
// use (not given back, and not past their expiry) never reach the limit;
// after the run, the hold intervals (grant to release, or to expiry for a
// crashed holder, so expired leases keep their slot until they really end)
// never overlap more than the limit; and a limit-1 key guards a
// read-then-write counter that must not lose an update. Fencing tokens must
// be unique per key.
//
// A lease lasts until its expiry by the store's clock, the host's wall
// clock, which the test shares. A release or renewal may find a lease gone
// only once that clock has passed its expiry: a forward step of the wall
// clock, or a stall longer than the lease, ends leases early, and the test
// holds the store to that rule rather than to the monotonic clock. A step
// back mid-run is not allowed for: the hold intervals, a release's end by
// this process's clock against the next grant's start by the store's,
// could then seem to overlap.
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
		used     = inUse{byKey: map[string]map[string]time.Time{}}
		grants   = make(map[string]*atomic.Int64, nKeys)
		counter  atomic.Int64 // incremented by read, pause, write: only a lease makes it safe
		mutexOps atomic.Int64
		mutexEnd atomic.Int64 // mutex leases that ended while in use
		ended    atomic.Int64 // leases that ended by the clock while in use (see ends)
		wg       sync.WaitGroup
		errs     = make(chan error, 64)
		deadline = time.Now().Add(d)
		holds    = holdLog{byKey: map[string][]hold{}}
	)
	for _, id := range ids {
		grants[id] = new(atomic.Int64)
	}
	report := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	// ends says whether err is a lease l lost to its expiry: the store's
	// clock (this host's) has passed l's end. Any other error is reported.
	ends := func(what string, l optimistic.Lease, err error) bool {
		if err == nil {
			return false
		}
		if errors.Is(err, optimistic.ErrLeaseLost) && !wallNow().Before(l.Until) {
			ended.Add(1)
			return true
		}
		report(fmt.Errorf("%s, lease live until %s: %w", what, l.Until.Format(time.RFC3339Nano), err))
		return false
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
			// The store granted at its now, Until-ttl.
			start := l.Until.Add(-ttl)
			if n := used.grant(l, start); n > limits[l.KeyID] {
				report(fmt.Errorf("oversold: %d leases of %s in use at %s, limit %d", n, l.KeyID, start.Format(time.RFC3339Nano), limits[l.KeyID]))
			}
			if crash {
				// The holder dies: the store keeps the slot until the
				// lease expires, and so does used.
				holds.add(l, start, l.Until)
				continue
			}
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
			if rng.IntN(4) == 0 {
				until, err := s.Renew(context.Background(), l.LeaseRef, ttl)
				if ends("renew", l, err) {
					used.end(l)
					holds.add(l, start, l.Until)
					continue
				}
				if err == nil {
					l.Until = until
					used.renew(l)
				}
			}
			// Out of use before the release frees the slot, and never
			// past the lease's end.
			used.end(l)
			holds.add(l, start, minTime(wallNow(), l.Until))
			ends("release", l, s.Release(context.Background(), l.LeaseRef))
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
			if ends("release mutex", l, s.Release(context.Background(), l.LeaseRef)) {
				mutexEnd.Add(1)
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
	if n := ended.Load(); n > 0 {
		t.Logf("%d leases ended by the wall clock while in use (it stepped, or the host stalled, by more than a lease)", n)
	}
	// A mutex lease that ended while in use may lose one update to the
	// next holder; nothing else may.
	lost := mutexOps.Load() - counter.Load()
	require.True(t, lost >= 0 && lost <= mutexEnd.Load(), "%d lost updates under the limit-1 lease (%d of its leases ended in use)", lost, mutexEnd.Load())
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

// inUse tracks each key's leases in use, by their end (the store's clock).
type inUse struct {
	mu    sync.Mutex
	byKey map[string]map[string]time.Time // key id → lease id → until
}

// grant adds l, granted at start, and returns how many of its key's leases
// are in use then, l included: those not ended and not past their end.
func (u *inUse) grant(l optimistic.Lease, start time.Time) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	leases := u.byKey[l.KeyID]
	if leases == nil {
		leases = map[string]time.Time{}
		u.byKey[l.KeyID] = leases
	}
	n := 1
	for id, until := range leases {
		if until.After(start) {
			n++
		} else {
			delete(leases, id)
		}
	}
	leases[l.LeaseID] = l.Until
	return n
}

// renew moves l's end to l.Until.
func (u *inUse) renew(l optimistic.Lease) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.byKey[l.KeyID][l.LeaseID] = l.Until
}

// end takes l out of use.
func (u *inUse) end(l optimistic.Lease) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.byKey[l.KeyID], l.LeaseID)
}

// wallNow is the host's wall clock alone, the store's clock: a time with
// Go's monotonic reading compares by that instead.
func wallNow() time.Time { return time.Now().Round(0) }

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
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
