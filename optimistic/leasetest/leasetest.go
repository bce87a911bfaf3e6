// Package leasetest is the lease store contract of DESIGN.md as a test
// suite, in the shape of testing/fstest: one call proves any
// optimistic.LeaseStore, credpool's own or yours.
//
//	func TestMyStore(t *testing.T) {
//		leasetest.Run(t, func(t *testing.T) leasetest.Backend {
//			return leasetest.Backend{Store: ..., Peer: ..., SetField: ..., Find: ..., Stop: ...}
//		})
//	}
//
// Run gives each case a fresh, empty backend, so cases run in parallel.
// Stress hammers one backend with concurrent allocators, renewals,
// releases and crashes and checks the invariants afterwards: never more
// holders than the limit, never a fencing token twice, no lost update.
// Racing callers are spread over the backend's Store and its peers, as
// over several processes, so that a store which queues its own callers
// (per key, per file) cannot hide a race that its transactions lose.
package leasetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/optimistic"
)

// Backend is one empty lease store under test, with the hooks the suite
// needs to look behind the contract. Every field is required.
type Backend struct {
	Store optimistic.LeaseStore
	// Peer returns another store over the same data, cleaned up when t
	// ends, as a second process would open it: sharing no in-process state
	// with Store or other peers (gates, locks, connections).
	Peer func(t *testing.T) optimistic.LeaseStore
	// SetField overwrites one stored field of a key's allocation state with
	// a raw value, as a buggy catalog sync might leave it; nil removes it.
	// Fields: "max_concurrent_uses", "cooldown_until".
	SetField func(t *testing.T, keyID, field string, value *string)
	// Find lists every stored item whose name or content contains s.
	Find func(t *testing.T, s string) []string
	// Stop makes the store unreachable for the rest of the test: a killed
	// server, a closed database.
	Stop func(t *testing.T)
}

// Factory returns a fresh Backend, cleaned up when t ends.
type Factory func(t *testing.T) Backend

const (
	provider = "openai"
	pool     = "default"
	longTTL  = time.Minute
	// shortTTL is long enough for the next call to surely see the lease
	// live on a loaded CI machine, short enough to wait out.
	shortTTL = time.Second
)

func key(id string, limit int) optimistic.KeyState {
	return optimistic.KeyState{ID: id, Provider: provider, Pool: pool, Status: optimistic.StatusAvailable, MaxConcurrentUses: limit}
}

func syncKeys(t *testing.T, b Backend, keys ...optimistic.KeyState) {
	t.Helper()
	for _, k := range keys {
		require.NoError(t, b.Store.SyncKey(context.Background(), k))
	}
}

func allocate(b Backend, ttl time.Duration, candidates ...string) (optimistic.Lease, error) {
	return allocateOn(b.Store, ttl, candidates...)
}

func allocateOn(s optimistic.LeaseStore, ttl time.Duration, candidates ...string) (optimistic.Lease, error) {
	l, _, err := s.Allocate(context.Background(), optimistic.AllocateRequest{
		Provider: provider, Pool: pool, Candidates: candidates, TTL: ttl,
	})
	return l, err
}

// processes is how many stores, the backend's and its peers, racing
// callers are spread over. Two already race where one store's own queue
// would hide it; more would have SQLite's busy handler, which arbitrates
// between processes, starve a writer past its retry budget.
const processes = 2

// stores returns the backend's Store and processes-1 peers of it.
func stores(t *testing.T, b Backend) []optimistic.LeaseStore {
	t.Helper()
	out := []optimistic.LeaseStore{b.Store}
	for len(out) < processes {
		out = append(out, b.Peer(t))
	}
	return out
}

func mustAllocate(t *testing.T, b Backend, ttl time.Duration, candidates ...string) optimistic.Lease {
	t.Helper()
	l, err := allocate(b, ttl, candidates...)
	require.NoError(t, err)
	return l
}

func requireNoCapacity(t *testing.T, b Backend, candidates ...string) *optimistic.CapacityError {
	t.Helper()
	_, err := allocate(b, longTTL, candidates...)
	var ce *optimistic.CapacityError
	require.ErrorAs(t, err, &ce, "want no free slot among %v", candidates)
	require.ErrorIs(t, err, optimistic.ErrNoCapacity)
	return ce
}

func info(t *testing.T, b Backend, id string) optimistic.KeyInfo {
	t.Helper()
	infos, err := b.Store.Inspect(context.Background(), id)
	require.NoError(t, err)
	require.Len(t, infos, 1)
	return infos[0]
}

// waitPast sleeps until the store's clock (the same host clock here) has
// passed at.
func waitPast(at time.Time) { time.Sleep(time.Until(at) + 20*time.Millisecond) }

func ptr(s string) *string { return &s }

// Run runs every case of the contract against fresh backends from newBackend.
func Run(t *testing.T, newBackend Factory) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, newBackend(t))
		})
	}
}

var cases = []struct {
	name string
	run  func(t *testing.T, b Backend)
}{
	{"Limit1Race64ExactlyOneWins", func(t *testing.T, b Backend) { raceOnKey(t, b, 1, 64, 20) }},
	{"Limit5Race64ExactlyFiveWin", func(t *testing.T, b Backend) { raceOnKey(t, b, 5, 64, 5) }},
	{"Limit2TwoGrantsThenNoSlot", limit2},
	{"ExpiredSlotReclaimedAndPruned", expiryReclaims},
	{"OnlyTheGrantedKeyIsPruned", prunesGrantedOnly},
	{"ReleaseFreesSlotAtOnce", releaseFrees},
	{"ReleaseWithWrongIDsKeepsLease", releaseMismatch},
	{"ReleaseAfterExpirySparesNewerLease", releaseAfterExpiry},
	{"DoubleRelease", doubleRelease},
	{"HoldsReadsWithoutReleasing", holds},
	{"RenewExtends", renewExtends},
	{"RenewAfterExpiryIsLost", renewAfterExpiry},
	{"RenewMismatch", renewMismatch},
	{"FirstCandidateWithRoomWins", orderWins},
	{"NonMemberSkippedAndUntouched", nonMember},
	{"UnusableStatusesSkipped", unusableSkipped},
	{"PassedCooldownRecovers", cooldownPassed},
	{"CooldownNotPassedSkipped", cooldownPending},
	{"EmptyCooldownSkipped", cooldownEmpty},
	{"CapacityErrorSaysWhatFreesFirst", freesFirst},
	{"BadLimitMeansOne", badLimit},
	{"SyncMovesPool", syncMovesPool},
	{"DeleteKeyLeavesNothing", deleteKey},
	{"ClearLeasesFreesAll", clearLeases},
	{"FencingTokensIncrease", fencing},
	{"InspectReportsLiveState", inspect},
	{"LastUsedAtIsTheLastGrant", lastUsed},
	{"InvalidInputRejectedBeforeStore", invalidInput},
	{"CancelledContext", cancelled},
	{"WaitingCallerGetsTheFreedSlot", waits},
	{"WaitEndsFullOrCancelled", waitEnds},
	{"SlotsFreedByExpiryWakeTheLine", expiryWakes},
	{"SlotsFreedByExpiryWakeOthersInLine", expiryWakesOthers},
	{"StoreDownIsNotNoCapacity", storeDown},
}

// raceOnKey runs rounds of workers concurrent allocates on a fresh key of
// the given limit, spread over the backend's stores: exactly limit must
// win, the rest must be refused.
func raceOnKey(t *testing.T, b Backend, limit, workers, rounds int) {
	procs := stores(t, b)
	for round := range rounds {
		id := fmt.Sprintf("race-%d", round)
		syncKeys(t, b, key(id, limit))
		results := make(chan error, workers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, err := allocateOn(procs[w%len(procs)], longTTL, id)
				results <- err
			}()
		}
		close(start)
		wg.Wait()
		close(results)
		won := 0
		for err := range results {
			switch {
			case err == nil:
				won++
			case errors.Is(err, optimistic.ErrNoCapacity), errors.Is(err, optimistic.ErrContended):
			default:
				t.Fatalf("round %d: unexpected error: %v", round, err)
			}
		}
		require.Equal(t, limit, won, "round %d: grants on a key with limit %d", round, limit)
		require.Equal(t, limit, info(t, b, id).Live, "round %d: live leases", round)
	}
}

func limit2(t *testing.T, b Backend) {
	syncKeys(t, b, key("k", 2))
	first := mustAllocate(t, b, longTTL, "k")
	mustAllocate(t, b, 2*longTTL, "k")
	ce := requireNoCapacity(t, b, "k")
	require.WithinDuration(t, first.Until, ce.FreeAt, time.Millisecond, "FreeAt is the earliest lease expiry")
	require.True(t, ce.Held, "a held lease may end before FreeAt")
}

func expiryReclaims(t *testing.T, b Backend) {
	syncKeys(t, b, key("k", 1))
	old := mustAllocate(t, b, shortTTL, "k")
	requireNoCapacity(t, b, "k")
	waitPast(old.Until)
	fresh, st, err := b.Store.Allocate(context.Background(), optimistic.AllocateRequest{
		Provider: provider, Pool: pool, Candidates: []string{"k"}, TTL: longTTL,
	})
	require.NoError(t, err)
	require.Equal(t, 1, st.Pruned, "the grant reports the expired lease it pruned")
	require.Positive(t, st.Attempts)
	require.NotEqual(t, old.LeaseID, fresh.LeaseID)
	require.Empty(t, b.Find(t, old.LeaseID), "the expired lease is pruned with its record")
	require.NotEmpty(t, b.Find(t, fresh.LeaseID))
}

// A grant prunes the expired leases of the key it grants on, and only
// those: Stats.Pruned means the same on every store.
func prunesGrantedOnly(t *testing.T, b Backend) {
	syncKeys(t, b, key("skipped", 1), key("granted", 1))
	old := mustAllocate(t, b, shortTTL, "skipped")
	waitPast(old.Until)
	disabled := key("skipped", 1)
	disabled.Status = optimistic.StatusDisabled
	syncKeys(t, b, disabled)
	l, st, err := b.Store.Allocate(context.Background(), optimistic.AllocateRequest{
		Provider: provider, Pool: pool, Candidates: []string{"skipped", "granted"}, TTL: longTTL,
	})
	require.NoError(t, err)
	require.Equal(t, "granted", l.KeyID)
	require.Zero(t, st.Pruned, "nothing expired on the granted key")
	require.NotEmpty(t, b.Find(t, old.LeaseID), "a skipped candidate's expired lease is left for its own next grant")
}

func releaseFrees(t *testing.T, b Backend) {
	syncKeys(t, b, key("k", 1))
	l := mustAllocate(t, b, longTTL, "k")
	require.NoError(t, b.Store.Release(context.Background(), l.LeaseRef))
	require.Empty(t, b.Find(t, l.LeaseID))
	mustAllocate(t, b, longTTL, "k")
}

func releaseMismatch(t *testing.T, b Backend) {
	syncKeys(t, b, key("k", 1), key("other", 1))
	l := mustAllocate(t, b, longTTL, "k")
	for name, ref := range map[string]optimistic.LeaseRef{
		"key id":   {Provider: provider, Pool: pool, KeyID: "other", LeaseID: l.LeaseID},
		"provider": {Provider: "anthropic", Pool: pool, KeyID: "k", LeaseID: l.LeaseID},
		"pool":     {Provider: provider, Pool: "vip", KeyID: "k", LeaseID: l.LeaseID},
	} {
		err := b.Store.Release(context.Background(), ref)
		require.ErrorIs(t, err, optimistic.ErrLeaseLost, "wrong %s", name)
		if name != "key id" {
			require.ErrorIs(t, err, optimistic.ErrLeaseMismatch, "wrong %s", name)
		}
		require.Equal(t, 1, info(t, b, "k").Live, "lease intact after release with wrong %s", name)
	}
	requireNoCapacity(t, b, "k")
	require.NoError(t, b.Store.Release(context.Background(), l.LeaseRef))
}

func releaseAfterExpiry(t *testing.T, b Backend) {
	syncKeys(t, b, key("k", 2))
	old := mustAllocate(t, b, shortTTL, "k")
	waitPast(old.Until)
	// Expired but not yet pruned: still not releasable.
	require.ErrorIs(t, b.Store.Release(context.Background(), old.LeaseRef), optimistic.ErrLeaseLost)
	newer := mustAllocate(t, b, longTTL, "k")
	require.ErrorIs(t, b.Store.Release(context.Background(), old.LeaseRef), optimistic.ErrLeaseLost)
	require.Equal(t, 1, info(t, b, "k").Live)
	require.NoError(t, b.Store.Release(context.Background(), newer.LeaseRef))
}

func doubleRelease(t *testing.T, b Backend) {
	syncKeys(t, b, key("k", 2))
	l := mustAllocate(t, b, longTTL, "k")
	other := mustAllocate(t, b, longTTL, "k")
	require.NoError(t, b.Store.Release(context.Background(), l.LeaseRef))
	err := b.Store.Release(context.Background(), l.LeaseRef)
	require.ErrorIs(t, err, optimistic.ErrLeaseLost)
	require.NotErrorIs(t, err, optimistic.ErrLeaseMismatch)
	require.Equal(t, 1, info(t, b, "k").Live, "the other lease survives")
	require.NoError(t, b.Store.Release(context.Background(), other.LeaseRef))
}

func holds(t *testing.T, b Backend) {
	syncKeys(t, b, key("k", 1), key("other", 1))
	ctx := context.Background()
	l := mustAllocate(t, b, shortTTL, "k")
	for range 2 {
		until, err := b.Store.Holds(ctx, l.LeaseRef)
		require.NoError(t, err)
		require.True(t, until.Equal(l.Until), "Holds says %v, the lease ends %v", until, l.Until)
	}
	require.Equal(t, 1, info(t, b, "k").Live, "Holds writes nothing")
	requireNoCapacity(t, b, "k")
	wrong := l.LeaseRef
	wrong.Pool = "vip"
	_, err := b.Store.Holds(ctx, wrong)
	require.ErrorIs(t, err, optimistic.ErrLeaseMismatch)
	wrong = l.LeaseRef
	wrong.KeyID = "other"
	_, err = b.Store.Holds(ctx, wrong)
	require.ErrorIs(t, err, optimistic.ErrLeaseLost)
	renewed, err := b.Store.Renew(ctx, l.LeaseRef, longTTL)
	require.NoError(t, err)
	until, err := b.Store.Holds(ctx, l.LeaseRef)
	require.NoError(t, err)
	require.True(t, until.Equal(renewed), "after a renewal: %v, want %v", until, renewed)
	require.NoError(t, b.Store.Release(ctx, l.LeaseRef))
	_, err = b.Store.Holds(ctx, l.LeaseRef)
	require.ErrorIs(t, err, optimistic.ErrLeaseLost)
	require.NotErrorIs(t, err, optimistic.ErrLeaseMismatch)

	expiring := mustAllocate(t, b, shortTTL, "other")
	waitPast(expiring.Until)
	_, err = b.Store.Holds(ctx, expiring.LeaseRef)
	require.ErrorIs(t, err, optimistic.ErrLeaseLost, "expired, not pruned yet")
}

func renewExtends(t *testing.T, b Backend) {
	syncKeys(t, b, key("k", 1))
	l := mustAllocate(t, b, shortTTL, "k")
	until, err := b.Store.Renew(context.Background(), l.LeaseRef, longTTL)
	require.NoError(t, err)
	require.True(t, until.After(l.Until.Add(longTTL/2)), "renewed to %v, was %v", until, l.Until)
	waitPast(l.Until)
	ce := requireNoCapacity(t, b, "k")
	require.WithinDuration(t, until, ce.FreeAt, time.Millisecond)
	require.NoError(t, b.Store.Release(context.Background(), l.LeaseRef))
}

func renewAfterExpiry(t *testing.T, b Backend) {
	syncKeys(t, b, key("k", 1))
	l := mustAllocate(t, b, shortTTL, "k")
	waitPast(l.Until)
	_, err := b.Store.Renew(context.Background(), l.LeaseRef, longTTL)
	require.ErrorIs(t, err, optimistic.ErrLeaseLost)
	require.Equal(t, 0, info(t, b, "k").Live, "a lost lease is not recreated")
	fresh := mustAllocate(t, b, longTTL, "k")
	require.Empty(t, b.Find(t, l.LeaseID))
	_, err = b.Store.Renew(context.Background(), l.LeaseRef, longTTL)
	require.ErrorIs(t, err, optimistic.ErrLeaseLost, "pruned lease")
	require.NoError(t, b.Store.Release(context.Background(), fresh.LeaseRef))
}

func renewMismatch(t *testing.T, b Backend) {
	syncKeys(t, b, key("k", 1))
	l := mustAllocate(t, b, shortTTL, "k")
	ref := l.LeaseRef
	ref.Pool = "vip"
	_, err := b.Store.Renew(context.Background(), ref, longTTL)
	require.ErrorIs(t, err, optimistic.ErrLeaseMismatch)
	waitPast(l.Until)
	mustAllocate(t, b, longTTL, "k")
}

func orderWins(t *testing.T, b Backend) {
	syncKeys(t, b, key("a", 1), key("b", 1), key("c", 1))
	mustAllocate(t, b, longTTL, "a")
	require.Equal(t, "b", mustAllocate(t, b, longTTL, "a", "b", "c").KeyID)
	require.Equal(t, "c", mustAllocate(t, b, longTTL, "a", "b", "c").KeyID)
	requireNoCapacity(t, b, "a", "b", "c")
}

func nonMember(t *testing.T, b Backend) {
	elsewhere := key("elsewhere", 5)
	elsewhere.Pool = "vip"
	otherProvider := key("foreign", 5)
	otherProvider.Provider = "anthropic"
	syncKeys(t, b, elsewhere, otherProvider, key("home", 1))
	l := mustAllocate(t, b, longTTL, "ghost", "elsewhere", "foreign", "home")
	require.Equal(t, "home", l.KeyID)
	require.Empty(t, b.Find(t, "ghost"), "an unknown id gets nothing written")
	for _, id := range []string{"elsewhere", "foreign"} {
		got := info(t, b, id)
		require.Zero(t, got.Live, id)
		require.Zero(t, got.Fence, id)
	}
	ce := requireNoCapacity(t, b, "ghost", "elsewhere", "foreign")
	require.True(t, ce.FreeAt.IsZero(), "nothing frees up by itself: %v", ce.FreeAt)
	require.False(t, ce.Held)
}

func unusableSkipped(t *testing.T, b Backend) {
	for _, st := range []optimistic.Status{optimistic.StatusDisabled, optimistic.StatusPending, optimistic.StatusExhausted} {
		k := key(string(st), 5)
		k.Status = st
		syncKeys(t, b, k)
		requireNoCapacity(t, b, k.ID)
		require.Zero(t, info(t, b, k.ID).Live, st)
	}
}

func cooldownPassed(t *testing.T, b Backend) {
	for _, st := range []optimistic.Status{optimistic.StatusRateLimited, optimistic.StatusCooldown} {
		k := key(string(st), 1)
		k.Status = st
		k.CooldownUntil = time.Now().Add(-time.Second)
		syncKeys(t, b, k)
		mustAllocate(t, b, longTTL, k.ID)
		got := info(t, b, k.ID)
		require.Equal(t, optimistic.StatusAvailable, got.Status, st)
		require.True(t, got.CooldownUntil.IsZero(), "%s: cooldown cleared, got %v", st, got.CooldownUntil)
	}
}

func cooldownPending(t *testing.T, b Backend) {
	for _, st := range []optimistic.Status{optimistic.StatusRateLimited, optimistic.StatusCooldown} {
		k := key(string(st), 1)
		k.Status = st
		k.CooldownUntil = time.Now().Add(time.Hour).Truncate(time.Millisecond)
		syncKeys(t, b, k)
		ce := requireNoCapacity(t, b, k.ID)
		require.True(t, k.CooldownUntil.Equal(ce.FreeAt), "%s: FreeAt %v, cooldown ends %v", st, ce.FreeAt, k.CooldownUntil)
		require.False(t, ce.Held, "%s: a cooldown's end is no lease's", st)
		require.Equal(t, st, info(t, b, k.ID).Status)
	}
}

func freesFirst(t *testing.T, b Backend) {
	cooling := key("cooling", 1)
	cooling.Status, cooling.CooldownUntil = optimistic.StatusRateLimited, time.Now().Add(30*time.Second).Truncate(time.Millisecond)
	syncKeys(t, b, cooling, key("full", 1))
	l := mustAllocate(t, b, longTTL, "full")
	ce := requireNoCapacity(t, b, "full", "cooling")
	require.True(t, cooling.CooldownUntil.Equal(ce.FreeAt), "the cooldown ends first: %v", ce.FreeAt)
	require.False(t, ce.Held)

	short := key("short", 1)
	syncKeys(t, b, short)
	s := mustAllocate(t, b, 10*time.Second, "short")
	ce = requireNoCapacity(t, b, "cooling", "short", "full")
	require.True(t, s.Until.Equal(ce.FreeAt), "the short lease ends first: %v", ce.FreeAt)
	require.True(t, ce.Held)
	require.True(t, l.Until.After(ce.FreeAt))
}

func cooldownEmpty(t *testing.T, b Backend) {
	k := key("k", 1)
	k.Status = optimistic.StatusRateLimited
	syncKeys(t, b, k)
	requireNoCapacity(t, b, "k")
	b.SetField(t, "k", "cooldown_until", ptr("soon"))
	requireNoCapacity(t, b, "k")
}

func badLimit(t *testing.T, b Backend) {
	for i, raw := range []*string{nil, ptr("abc"), ptr("0"), ptr("-3"), ptr("")} {
		id := fmt.Sprintf("k%d", i)
		syncKeys(t, b, key(id, 5))
		b.SetField(t, id, "max_concurrent_uses", raw)
		mustAllocate(t, b, longTTL, id)
		requireNoCapacity(t, b, id)
		require.Equal(t, 1, info(t, b, id).Limit)
	}
}

func syncMovesPool(t *testing.T, b Backend) {
	k := key("k", 1)
	syncKeys(t, b, k)
	held := mustAllocate(t, b, longTTL, "k")
	k.Pool = "vip"
	syncKeys(t, b, k)
	requireNoCapacity(t, b, "k")
	// The limit is the credential's: a lease taken in the old pool still counts.
	_, _, err := b.Store.Allocate(context.Background(), optimistic.AllocateRequest{Provider: provider, Pool: "vip", Candidates: []string{"k"}, TTL: longTTL})
	require.ErrorIs(t, err, optimistic.ErrNoCapacity)
	require.NoError(t, b.Store.Release(context.Background(), held.LeaseRef), "a lease is released in the pool it was taken in")
	l, _, err := b.Store.Allocate(context.Background(), optimistic.AllocateRequest{Provider: provider, Pool: "vip", Candidates: []string{"k"}, TTL: longTTL})
	require.NoError(t, err)
	require.Equal(t, "vip", l.Pool)
}

func deleteKey(t *testing.T, b Backend) {
	syncKeys(t, b, key("doomed-key", 3), key("kept", 1))
	l := mustAllocate(t, b, longTTL, "doomed-key")
	mustAllocate(t, b, shortTTL, "doomed-key")
	mustAllocate(t, b, longTTL, "kept")
	require.NotEmpty(t, b.Find(t, "doomed-key"))
	require.NoError(t, b.Store.DeleteKey(context.Background(), "doomed-key"))
	require.Empty(t, b.Find(t, "doomed-key"), "no trace of a deleted key")
	require.Empty(t, b.Find(t, l.LeaseID))
	require.False(t, info(t, b, "doomed-key").Exists)
	requireNoCapacity(t, b, "doomed-key")
	require.ErrorIs(t, b.Store.Release(context.Background(), l.LeaseRef), optimistic.ErrLeaseLost)
	require.NoError(t, b.Store.DeleteKey(context.Background(), "doomed-key"), "deleting twice is fine")
	require.Equal(t, 1, info(t, b, "kept").Live)
}

func clearLeases(t *testing.T, b Backend) {
	syncKeys(t, b, key("k", 2))
	l := mustAllocate(t, b, longTTL, "k")
	mustAllocate(t, b, longTTL, "k")
	requireNoCapacity(t, b, "k")
	n, err := b.Store.ClearLeases(context.Background(), "k")
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Empty(t, b.Find(t, l.LeaseID))
	require.ErrorIs(t, b.Store.Release(context.Background(), l.LeaseRef), optimistic.ErrLeaseLost)
	mustAllocate(t, b, longTTL, "k")
	mustAllocate(t, b, longTTL, "k")
	n, err = b.Store.ClearLeases(context.Background(), "missing")
	require.NoError(t, err)
	require.Zero(t, n)
}

func fencing(t *testing.T, b Backend) {
	syncKeys(t, b, key("k", 8), key("other", 1))
	last := int64(0)
	for i := range 20 {
		l := mustAllocate(t, b, longTTL, "k")
		require.Greater(t, l.Fence, last, "grant %d", i)
		last = l.Fence
		if i%2 == 0 {
			require.NoError(t, b.Store.Release(context.Background(), l.LeaseRef))
		} else {
			_, err := b.Store.ClearLeases(context.Background(), "k")
			require.NoError(t, err)
		}
	}
	k := key("k", 3)
	k.Score = 42
	syncKeys(t, b, k)
	require.Greater(t, mustAllocate(t, b, longTTL, "k").Fence, last, "sync keeps the counter")

	// Tokens never go back, not even for a key deleted and synced again.
	last = info(t, b, "k").Fence
	require.NoError(t, b.Store.DeleteKey(context.Background(), "k"))
	syncKeys(t, b, key("k", 3))
	require.Greater(t, mustAllocate(t, b, longTTL, "k").Fence, last, "after DeleteKey")
	require.Greater(t, mustAllocate(t, b, longTTL, "other").Fence, int64(0))
}

func inspect(t *testing.T, b Backend) {
	syncKeys(t, b, key("k", 3))
	l := mustAllocate(t, b, longTTL, "k")
	mustAllocate(t, b, 2*longTTL, "k")
	infos, err := b.Store.Inspect(context.Background(), "k", "missing")
	require.NoError(t, err)
	require.Len(t, infos, 2)
	got := infos[0]
	require.True(t, got.Exists)
	require.Equal(t, provider, got.Provider)
	require.Equal(t, pool, got.Pool)
	require.Equal(t, 3, got.Limit)
	require.Equal(t, 2, got.Live)
	require.Greater(t, got.Fence, l.Fence, "the last token handed out")
	require.WithinDuration(t, time.Now(), got.FreeAt, 5*time.Second, "room now")
	mustAllocate(t, b, longTTL, "k")
	require.WithinDuration(t, l.Until, info(t, b, "k").FreeAt, time.Millisecond, "full: first expiry")
	require.Equal(t, "missing", infos[1].ID)
	require.False(t, infos[1].Exists)
	require.True(t, infos[1].FreeAt.IsZero())
}

func lastUsed(t *testing.T, b Backend) {
	// granted checks that k's last use is the grant of l, whose lease ends
	// a ttl after the store's now, and returns it.
	granted := func(k string, l optimistic.Lease, ttl time.Duration) time.Time {
		t.Helper()
		at := info(t, b, k).LastUsedAt
		require.WithinDuration(t, l.Until.Add(-ttl), at, time.Second)
		return at
	}
	seed := time.UnixMilli(1_700_000_000_000)
	seeded := key("seeded", 2)
	seeded.LastUsedAt = seed
	syncKeys(t, b, key("k", 2), seeded)
	require.True(t, info(t, b, "k").LastUsedAt.IsZero(), "never granted")
	require.True(t, info(t, b, "seeded").LastUsedAt.Equal(seed), "seeded by sync")

	first := granted("k", mustAllocate(t, b, longTTL, "k"), longTTL)
	time.Sleep(5 * time.Millisecond)
	l := mustAllocate(t, b, shortTTL, "k")
	require.True(t, granted("k", l, shortTTL).After(first), "moves with every grant")
	require.NoError(t, b.Store.Release(context.Background(), l.LeaseRef))
	last := granted("k", l, shortTTL)
	// A sync from an older catalog read never moves it back.
	stale := key("k", 2)
	stale.LastUsedAt = seed
	syncKeys(t, b, stale, key("k", 2))
	require.Equal(t, last, granted("k", l, shortTTL))

	l = mustAllocate(t, b, longTTL, "seeded")
	last = granted("seeded", l, longTTL)
	syncKeys(t, b, seeded)
	require.Equal(t, last, granted("seeded", l, longTTL))
	require.True(t, info(t, b, "missing").LastUsedAt.IsZero())
}

func invalidInput(t *testing.T, b Backend) {
	syncKeys(t, b, key("k", 1))
	// With the store down, only a check made before any store call can
	// return ErrInvalid.
	b.Stop(t)
	ctx := context.Background()
	good := optimistic.LeaseRef{Provider: provider, Pool: pool, KeyID: "k", LeaseID: "0f8fad5b-d9cb-469f-a165-70867728950e"}
	bad := []string{"", "-lead", "has space", "brace{tag}", "x/y", "ü", string(make([]byte, 129))}
	for _, id := range bad {
		_, _, err := b.Store.Allocate(ctx, optimistic.AllocateRequest{Provider: provider, Pool: pool, Candidates: []string{"k", id}, TTL: longTTL})
		require.ErrorIs(t, err, optimistic.ErrInvalid, "candidate %q", id)
		_, _, err = b.Store.Allocate(ctx, optimistic.AllocateRequest{Provider: id, Pool: pool, Candidates: []string{"k"}, TTL: longTTL})
		require.ErrorIs(t, err, optimistic.ErrInvalid, "provider %q", id)
		ref := good
		ref.LeaseID = id
		require.ErrorIs(t, b.Store.Release(ctx, ref), optimistic.ErrInvalid, "lease id %q", id)
		ref = good
		ref.Pool = id
		_, err = b.Store.Renew(ctx, ref, longTTL)
		require.ErrorIs(t, err, optimistic.ErrInvalid, "pool %q", id)
		_, err = b.Store.Holds(ctx, ref)
		require.ErrorIs(t, err, optimistic.ErrInvalid, "pool %q", id)
		require.ErrorIs(t, b.Store.DeleteKey(ctx, id), optimistic.ErrInvalid, "key id %q", id)
		_, err = b.Store.ClearLeases(ctx, id)
		require.ErrorIs(t, err, optimistic.ErrInvalid, "key id %q", id)
		_, err = b.Store.Inspect(ctx, id)
		require.ErrorIs(t, err, optimistic.ErrInvalid, "key id %q", id)
		k := key("k", 1)
		k.ID = id
		require.ErrorIs(t, b.Store.SyncKey(ctx, k), optimistic.ErrInvalid, "key id %q", id)
	}
	_, _, err := b.Store.Allocate(ctx, optimistic.AllocateRequest{Provider: provider, Pool: pool, Candidates: []string{"k"}})
	require.ErrorIs(t, err, optimistic.ErrInvalid, "zero ttl")
	_, err = b.Store.Renew(ctx, good, 0)
	require.ErrorIs(t, err, optimistic.ErrInvalid, "zero ttl")
	k := key("k", 1)
	k.Status = "broken"
	require.ErrorIs(t, b.Store.SyncKey(ctx, k), optimistic.ErrInvalid, "unknown status")
}

func cancelled(t *testing.T, b Backend) {
	syncKeys(t, b, key("k", 1))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err := b.Store.Allocate(ctx, optimistic.AllocateRequest{Provider: provider, Pool: pool, Candidates: []string{"k"}, TTL: longTTL})
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, optimistic.ErrNoCapacity)
	require.NotErrorIs(t, err, optimistic.ErrStore)
	require.Zero(t, info(t, b, "k").Live)
}

func storeDown(t *testing.T, b Backend) {
	syncKeys(t, b, key("k", 1))
	l := mustAllocate(t, b, longTTL, "k")
	ctx := context.Background()
	require.NoError(t, b.Store.Ping(ctx))
	b.Stop(t)
	require.ErrorIs(t, b.Store.Ping(ctx), optimistic.ErrStore)
	_, _, err := allocateOnce(b)
	require.ErrorIs(t, err, optimistic.ErrStore)
	require.NotErrorIs(t, err, optimistic.ErrNoCapacity)
	require.ErrorIs(t, b.Store.Release(ctx, l.LeaseRef), optimistic.ErrStore)
	_, err = b.Store.Renew(ctx, l.LeaseRef, longTTL)
	require.ErrorIs(t, err, optimistic.ErrStore)
	_, err = b.Store.Holds(ctx, l.LeaseRef)
	require.ErrorIs(t, err, optimistic.ErrStore)
	require.ErrorIs(t, b.Store.SyncKey(ctx, key("k", 1)), optimistic.ErrStore)
	_, err = b.Store.Inspect(ctx, "k")
	require.ErrorIs(t, err, optimistic.ErrStore)
	require.ErrorIs(t, b.Store.DeleteKey(ctx, "k"), optimistic.ErrStore)
	_, err = b.Store.ClearLeases(ctx, "k")
	require.ErrorIs(t, err, optimistic.ErrStore)
}

func allocateOnce(b Backend) (optimistic.Lease, optimistic.Stats, error) {
	return b.Store.Allocate(context.Background(), optimistic.AllocateRequest{Provider: provider, Pool: pool, Candidates: []string{"k"}, TTL: longTTL})
}
