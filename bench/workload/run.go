package workload

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/credpool/credpool/optimistic"
)

// ErrCannotWait means a spec with waiting callers met a store that is not
// an optimistic.Waiter.
var ErrCannotWait = errors.New("workload: waiting callers need a store that waits (an optimistic.Waiter)")

// releaseTimeout bounds one release, which runs even after ctx ends so that
// no held slot is left behind.
const releaseTimeout = 10 * time.Second

// expiryGrace is how long before its lease expires a crashed holder stops
// counting, so that a late timer never blames a store that hands the slot
// on when the lease expires.
const expiryGrace = 100 * time.Millisecond

// Run drives store with spec until spec.Duration has passed, spec.Ops calls
// were made or ctx ends, and returns what happened. The keys must already be
// in the store (Spec.Key). Every grant goes through holders, the audit;
// several processes running one workload share it (OpenHolders). seed makes
// the callers' choices reproducible; give each process its own.
//
// Store failures do not end the run: they are counted, and a retrying
// caller pauses as after "no slot". Run fails only on an invalid spec,
// with ErrCannotWait, or when the OS refuses a caller its hold clock (a
// timerfd on Linux: one file descriptor per caller).
func Run(ctx context.Context, store optimistic.LeaseStore, spec Spec, holders *Holders, seed uint64) (*Result, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if _, ok := store.(optimistic.Waiter); spec.Wait > 0 && !ok {
		return nil, ErrCannotWait
	}
	r := &runner{
		store:   store,
		spec:    spec,
		holders: holders,
		res:     &Result{Latency: NewHistogram(), GrantLatency: NewHistogram(), TimeToGrant: NewHistogram()},
	}
	if spec.Choice == Zipf {
		r.zipf = NewZipfian(spec.Keys, ZipfTheta)
	}
	if spec.Rate > 0 {
		r.res.Offered = int64(spec.Rate * spec.Duration.Seconds())
		if spec.Ops > 0 {
			r.res.Offered = min(r.res.Offered, spec.Ops)
		}
	}
	clocks := make([]*holdClock, spec.Workers)
	for w := range clocks {
		c, err := newHoldClock()
		if err != nil {
			for _, c := range clocks[:w] {
				c.close()
			}
			return nil, err
		}
		clocks[w] = c
	}
	r.start = time.Now()
	r.deadline = r.start.Add(spec.Duration)
	var wg sync.WaitGroup
	for w, clock := range clocks {
		wg.Go(func() {
			defer clock.close()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			r.caller(ctx, newPicker(spec, r.zipf, rng), rng, clock)
		})
	}
	wg.Wait()
	r.res.Elapsed = time.Since(r.start)
	r.stopExpiries()
	return r.res, nil
}

// runner is the state the callers of one Run share.
type runner struct {
	store   optimistic.LeaseStore
	spec    Spec
	holders *Holders
	zipf    *Zipfian

	start, deadline time.Time
	started         atomic.Int64 // calls claimed so far

	// expiring counts the crashed holders whose drop is neither made nor
	// stopped yet.
	expiring sync.WaitGroup

	mu       sync.Mutex // guards res and expiries
	res      *Result
	expiries []expiry // the crashed holders' drops
}

// expiry is a crashed holder's drop, of key i, due when t fires.
type expiry struct {
	t *time.Timer
	i int
}

// claim takes the next call: it returns the instant the call is meant to
// start (open loop: on the rate's schedule, waiting for it if early;
// closed loop: now), or false when the run is over. An open loop's call
// that was due before the end but is claimed after it is not made: the
// callers fell behind, and working through their backlog would run past
// Duration.
func (r *runner) claim(ctx context.Context) (time.Time, bool) {
	n := r.started.Add(1)
	if r.spec.Ops > 0 && n > r.spec.Ops {
		return time.Time{}, false
	}
	now := time.Now()
	if !now.Before(r.deadline) || ctx.Err() != nil {
		return time.Time{}, false
	}
	if r.spec.Rate == 0 {
		return now, true
	}
	intended := r.start.Add(time.Duration(float64(n-1) / r.spec.Rate * float64(time.Second)))
	if !intended.Before(r.deadline) {
		return time.Time{}, false
	}
	return intended, Sleep(ctx, time.Until(intended))
}

// caller is one simulated broker caller.
func (r *runner) caller(ctx context.Context, p *picker, rng *rand.Rand, clock *holdClock) {
	local := &Result{}
	// first is when the caller's first call for its next grant started;
	// zero until then.
	var first time.Time
	defer func() {
		if !first.IsZero() {
			// Still waiting: its wait so far counts, so a caller starved
			// for the whole run shows.
			local.Waiting++
			r.unserved(time.Since(first))
		}
		local.CallerGrants = []int64{local.Grants}
		r.mu.Lock()
		r.res.Merge(local)
		r.mu.Unlock()
	}()
	closed, waiting := r.spec.Rate == 0, r.spec.Wait > 0
	for {
		intended, ok := r.claim(ctx)
		if !ok {
			return
		}
		if !closed || first.IsZero() {
			first = intended
		}
		cands := p.candidates()
		req := optimistic.AllocateRequest{Provider: Provider, Pool: Pool, Candidates: cands, TTL: r.spec.TTL}
		if waiting {
			// Never past the run's end, so that no caller outlives it.
			if req.Wait = min(r.spec.Wait, time.Until(r.deadline)); req.Wait <= 0 {
				return
			}
		}
		lease, st, err := r.store.Allocate(ctx, req)
		if err != nil && ctx.Err() != nil {
			return // cut short by the caller of Run: not the store's doing
		}
		end := time.Now()
		latency := end.Sub(intended)
		local.Calls++
		local.Attempts += int64(st.Attempts)
		local.Conflicts += int64(st.Conflicts)
		local.Pruned += int64(st.Pruned)
		r.record(latency, end.Sub(first), err == nil)
		if err == nil || !closed {
			first = time.Time{}
		}
		switch {
		case err == nil:
			local.Grants++
			r.hold(ctx, local, p, rng, clock, lease, cands)
			continue
		case errors.Is(err, optimistic.ErrNoCapacity):
			local.NoSlot++
		case errors.Is(err, optimistic.ErrContended):
			local.GiveUps++
		default:
			local.Errors++
			if local.FirstError == "" {
				local.FirstError = err.Error()
			}
		}
		// A waiting caller waited in line already: it asks again at once.
		if closed && !waiting && !Sleep(ctx, p.pause()) {
			return
		}
	}
}

// record adds one call's latency and, for a grant, its time to grant.
func (r *runner) record(latency, toGrant time.Duration, granted bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.res.Latency.Record(latency)
	if granted {
		r.res.GrantLatency.Record(latency)
		r.res.TimeToGrant.Record(toGrant)
	}
}

// unserved adds the wait of a caller that the end of the run left without
// a grant.
func (r *runner) unserved(wait time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.res.TimeToGrant.Record(wait)
}

// hold uses a granted slot under the audit, then releases it, or crashes:
// stops using it and leaves the lease to expire, and the audit counts it
// until then.
func (r *runner) hold(ctx context.Context, local *Result, p *picker, rng *rand.Rand, clock *holdClock, lease optimistic.Lease, cands []string) {
	if !slices.Contains(cands, lease.KeyID) {
		r.violation(local, fmt.Sprintf("granted %s, which was not among the candidates %v", lease.KeyID, cands))
		return
	}
	// Ids come from KeyID, so the index parses.
	i, _ := strconv.Atoi(lease.KeyID[1:])
	n, over := r.holders.Acquire(i)
	local.MaxHolders = max(local.MaxHolders, n)
	if over {
		r.violation(local, fmt.Sprintf("%d holders of %s, limit %d", n, lease.KeyID, r.spec.Limit))
	}
	if rng.Float64() < r.spec.CrashShare {
		// The slot stays taken until the lease expires, used or not.
		r.dropAt(i, lease.Until.Add(-expiryGrace))
		local.Crashed++
		return
	}
	d := p.hold()
	start := time.Now()
	if clock.hold(ctx, d) && d > 0 {
		excess := time.Since(start) - d
		local.Held++
		local.HoldExcess += excess
		if excess < 0 {
			local.ShortHolds++
		}
	}
	// Stop using the key before the store may hand it on.
	r.holders.Drop(i)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	switch err := r.store.Release(rctx, lease.LeaseRef); {
	case err == nil:
		local.Released++
	case errors.Is(err, optimistic.ErrLeaseLost):
		local.Lost++
	default:
		local.ReleaseErrors++
		if local.FirstError == "" {
			local.FirstError = "release: " + err.Error()
		}
	}
}

// dropAt counts a holder of key i fewer at the instant at.
func (r *runner) dropAt(i int, at time.Time) {
	r.expiring.Add(1)
	t := time.AfterFunc(time.Until(at), func() {
		defer r.expiring.Done()
		r.holders.Drop(i)
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expiries = append(r.expiries, expiry{t, i})
}

// stopExpiries makes the drops still to come at once, and waits for those
// under way, once every caller has stopped: the holder count may be
// unmapped once Run returns, and other processes sharing it may still
// grant for a moment, which a holder counted for ever would blame.
func (r *runner) stopExpiries() {
	r.mu.Lock()
	for _, e := range r.expiries {
		if e.t.Stop() {
			r.holders.Drop(e.i)
			r.expiring.Done()
		}
	}
	r.mu.Unlock()
	r.expiring.Wait()
}

func (r *runner) violation(local *Result, msg string) {
	local.Violations++
	if local.FirstViolation == "" {
		local.FirstViolation = msg
	}
}

// Sleep waits d or until ctx ends, and says whether it waited it all.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
