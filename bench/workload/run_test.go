package workload

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/optimistic"
)

// spec is a small valid workload: one key of limit 2, closed loop.
func spec() Spec {
	return Spec{
		Keys: 1, Limit: 2, Candidates: 1, Choice: Hot, Order: Ranked, Workers: 4,
		HoldDist: Fixed, Duration: 10 * time.Second, TTL: time.Minute,
	}
}

// run syncs s's keys into store and runs s with a fresh audit.
func run(t *testing.T, store optimistic.LeaseStore, s Spec) *Result {
	t.Helper()
	ctx := context.Background()
	for i := range s.Keys {
		require.NoError(t, store.SyncKey(ctx, s.Key(i)))
	}
	res, err := Run(ctx, store, s, NewHolders(s.Keys, s.Limit), 1)
	require.NoError(t, err)
	return res
}

func TestRunClosedLoopStopsAfterOps(t *testing.T) {
	store := newMemStore()
	s := spec()
	s.Ops, s.Hold = 300, 100*time.Microsecond
	res := run(t, store, s)
	require.Equal(t, int64(300), res.Calls)
	require.Equal(t, res.Calls, res.Grants+res.NoSlot+res.GiveUps+res.Errors)
	require.Equal(t, res.Grants, res.Released)
	require.Equal(t, res.Released, res.Held, "every hold timed")
	require.Zero(t, res.ShortHolds, "no hold ends early")
	require.Zero(t, res.Violations)
	require.LessOrEqual(t, res.MaxHolders, int64(2))
	require.Equal(t, res.Calls, res.Latency.h.TotalCount())
	require.Equal(t, res.Grants, res.GrantLatency.h.TotalCount())
	require.Equal(t, res.Grants+res.Waiting, res.TimeToGrant.h.TotalCount())
	infos, err := store.Inspect(context.Background(), "k0")
	require.NoError(t, err)
	require.Zero(t, infos[0].Live, "every grant was released")
}

// The schedule alone decides how many calls an open loop offers: every
// intended start before the end of the run. Callers make those they can
// before it ends.
func TestRunOpenLoopOffersAtRate(t *testing.T) {
	s := spec()
	s.Rate, s.Duration = 1000, 100*time.Millisecond
	res := run(t, newMemStore(), s)
	require.Equal(t, int64(100), res.Offered)
	require.LessOrEqual(t, res.Calls, res.Offered)
	require.Positive(t, res.Calls)
}

// A store that cannot keep up does not stretch the run: two callers
// against a store that takes 20ms per call make at most 25 calls each
// before the end (sleeps never end early), of the 250 offered, and stop
// once the call in hand returns, where working through every offered call
// took 2.5s.
func TestRunOpenLoopEndsOnTime(t *testing.T) {
	store := newMemStore()
	store.delay = 20 * time.Millisecond
	s := spec()
	s.Keys, s.Limit, s.Candidates, s.Choice = 100, 100, 1, Uniform
	s.Workers, s.Rate, s.Duration = 2, 500, 500*time.Millisecond
	res := run(t, store, s)
	require.Equal(t, int64(250), res.Offered)
	require.LessOrEqual(t, res.Calls, int64(50))
	require.Equal(t, res.Calls, res.Grants+res.NoSlot+res.GiveUps+res.Errors)
	require.Equal(t, res.Calls, res.Latency.h.TotalCount())
}

// No coordinated omission: one caller against a store that takes 5ms per
// call cannot keep a 1ms schedule, and the late calls' latency counts from
// when they were due. Call k was due at k-1 ms but cannot start before
// (k-1)×5ms, so it returns at least 4(k-1)+5 ms after it was due; sleeps
// never end early, so the bound holds on any machine. The calls still due
// when the run ends are not made.
func TestRunOpenLoopLatencyFromIntendedStart(t *testing.T) {
	store := newMemStore()
	store.delay = 5 * time.Millisecond
	s := spec()
	s.Workers, s.Rate, s.Duration = 1, 1000, 100*time.Millisecond
	res := run(t, store, s)
	require.Positive(t, res.Calls)
	require.LessOrEqual(t, res.Calls, int64(20), "none starts after the end")
	require.GreaterOrEqual(t, res.Latency.Max(), time.Duration(4*(res.Calls-1)+5)*time.Millisecond)

	// A closed loop times each call alone: the 19 others took at least
	// 5ms each, so no call's latency can be the run's length.
	closed := spec()
	closed.Workers, closed.Ops = 1, 20
	start := time.Now()
	res = run(t, store, closed)
	elapsed := time.Since(start)
	require.LessOrEqual(t, res.Latency.Max(), elapsed-19*store.delay, "a closed loop times each call alone")
}

// Time to grant spans a caller's calls that found no slot and the pauses
// after them: two callers share one slot held 20ms at a time, so whoever
// comes second waits at least that long (for its grant, or until the run
// ends), however quick each call is.
func TestRunTimeToGrantCountsRetries(t *testing.T) {
	s := spec()
	s.Limit, s.Workers, s.Hold, s.Pause, s.Duration = 1, 2, 20*time.Millisecond, time.Millisecond, 200*time.Millisecond
	res := run(t, newMemStore(), s)
	require.Positive(t, res.NoSlot)
	require.Equal(t, res.Grants+res.Waiting, res.TimeToGrant.h.TotalCount(), "one per grant, one per caller left waiting")
	require.GreaterOrEqual(t, res.TimeToGrant.Max(), 20*time.Millisecond)
	require.Greater(t, res.TimeToGrant.Max(), res.GrantLatency.Max(), "no single call waited for the slot")

	s.Rate, s.Pause = 500, 0
	res = run(t, newMemStore(), s)
	require.Zero(t, res.Waiting)
	require.Equal(t, res.GrantLatency.Summary(), res.TimeToGrant.Summary(), "open loop: every call is a request of its own")
}

func TestRunCrashedHoldersLeaveLeases(t *testing.T) {
	store := newMemStore()
	s := spec()
	s.CrashShare, s.Ops = 1, 50
	res := run(t, store, s)
	require.Equal(t, int64(2), res.Grants, "two crashed holders fill the key until their leases expire")
	require.Equal(t, int64(2), res.Crashed)
	require.Zero(t, res.Released)
	require.Equal(t, int64(48), res.NoSlot)
	require.Zero(t, res.Violations, "the crashed holders count until their leases expire, after the run")
}

// The audit on its own: a store that ignores limits is caught.
func TestRunAuditCatchesOverselling(t *testing.T) {
	store := newMemStore()
	store.oversell = true
	s := spec()
	s.Limit, s.Workers, s.Hold, s.Ops = 1, 8, time.Millisecond, 200
	res := run(t, store, s)
	require.Positive(t, res.Violations)
	require.Greater(t, res.MaxHolders, int64(1))
	require.Contains(t, res.FirstViolation, "holders of k0, limit 1")
}

// Processes share the holder count through the file; two mappings in one
// process see each other's counts the same way.
func TestHoldersShareAcrossMappings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "holders")
	require.NoError(t, CreateHoldersFile(path, 3))
	require.Error(t, CreateHoldersFile(path, 3), "a run never reuses a holder file")
	a, err := OpenHolders(path, 3, 1)
	require.NoError(t, err)
	b, err := OpenHolders(path, 3, 1)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, a.Close())
		require.NoError(t, b.Close())
	})
	n, over := a.Acquire(2)
	require.Equal(t, int64(1), n)
	require.False(t, over)
	n, over = b.Acquire(2)
	require.Equal(t, int64(2), n)
	require.True(t, over)
	b.Drop(2)
	n, over = a.Acquire(1)
	require.Equal(t, int64(1), n, "keys count apart")
	require.False(t, over)
	_, err = OpenHolders(filepath.Join(t.TempDir(), "missing"), 3, 1)
	require.Error(t, err)
}

func TestSpecValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Spec)
		ok   bool
	}{
		{"valid", func(*Spec) {}, true},
		{"no keys", func(s *Spec) { s.Keys = 0 }, false},
		{"limit 0", func(s *Spec) { s.Limit = 0 }, false},
		{"more candidates than keys", func(s *Spec) { s.Candidates = 2 }, false},
		{"no workers", func(s *Spec) { s.Workers = 0 }, false},
		{"no duration", func(s *Spec) { s.Duration = 0 }, false},
		{"crash share above 1", func(s *Spec) { s.CrashShare = 1.5 }, false},
		{"ttl under 1ms", func(s *Spec) { s.TTL = time.Microsecond }, false},
		{"unknown choice", func(s *Spec) { s.Choice = "pareto" }, false},
		{"unknown order", func(s *Spec) { s.Order = "sorted" }, false},
		{"unknown hold distribution", func(s *Spec) { s.HoldDist = "normal" }, false},
		{"negative rate", func(s *Spec) { s.Rate = -1 }, false},
		{"negative wait", func(s *Spec) { s.Wait = -time.Second }, false},
		{"waiting in an open loop", func(s *Spec) { s.Wait, s.Rate = time.Second, 100 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec()
			tc.edit(&s)
			err := s.Validate()
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			_, err = Run(context.Background(), newMemStore(), s, NewHolders(1, 1), 1)
			require.Error(t, err, "Run refuses it too")
		})
	}
}

// Waiting callers queue for the one slot instead of pausing: they take
// "no slot" only when the run ends, a wait longer than the run does not
// hold it up, every caller is served, and each has its own grant count.
func TestRunWaitingCallers(t *testing.T) {
	s := spec()
	s.Limit, s.Workers, s.Hold, s.Duration, s.Wait = 1, 4, 2*time.Millisecond, 300*time.Millisecond, time.Minute
	start := time.Now()
	res := run(t, &waitStore{memStore: newMemStore()}, s)
	require.Less(t, time.Since(start), s.Duration+time.Second, "the run's end bounds every wait")
	require.Zero(t, res.Violations)
	require.Zero(t, res.Errors)
	require.LessOrEqual(t, res.NoSlot, int64(s.Workers), "at most one \"no slot\" per caller, at the end")
	require.Len(t, res.CallerGrants, s.Workers)
	var sum int64
	for i, n := range res.CallerGrants {
		require.Positive(t, n, "caller %d", i)
		sum += n
	}
	require.Equal(t, res.Grants, sum)
}

func TestRunWaitingNeedsAWaiter(t *testing.T) {
	s := spec()
	s.Wait = time.Second
	_, err := Run(context.Background(), newMemStore(), s, NewHolders(1, 2), 1)
	require.ErrorIs(t, err, ErrCannotWait)
}

// Each process's callers keep their own entries when results merge.
func TestResultMergeKeepsEveryCaller(t *testing.T) {
	r := &Result{}
	r.Merge(&Result{Grants: 5, CallerGrants: []int64{2, 3}, Held: 5, HoldExcess: 50 * time.Microsecond, ShortHolds: 1})
	r.Merge(&Result{Grants: 4, CallerGrants: []int64{4, 0}, Held: 4, HoldExcess: 40 * time.Microsecond, ShortHolds: 2})
	require.Equal(t, []int64{2, 3, 4, 0}, r.CallerGrants)
	require.Equal(t, int64(9), r.Grants)
	require.Equal(t, int64(9), r.Held)
	require.Equal(t, 90*time.Microsecond, r.HoldExcess)
	require.Equal(t, int64(3), r.ShortHolds)
}
