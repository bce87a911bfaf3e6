package broker_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/requestlog"
	"github.com/credpool/credpool/optimistic"
)

// hooked returns an env with key a of the given limit, its store behind a
// hookStore, and a Broker over them that is closed when the test ends.
func hooked(t *testing.T, limit int) (*env, *hookStore, *broker.Broker) {
	t.Helper()
	e := newEnv(t, key("a", "default", limit))
	s := &hookStore{Store: e.store}
	b := e.broker(e.cat, s)
	t.Cleanup(func() {
		// Not t.Context(): it ends before cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		b.Close(ctx)
	})
	return e, s, b
}

// eventually waits, bounded, for a background effect.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still not %s after 10s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A report records before it releases: if the catalog write fails the
// caller still holds the lease, so the report can be retried, and the key
// is never granted in between as if nothing happened.
func TestReportRecordsBeforeReleasing(t *testing.T) {
	e := newEnv(t, key("a", "default", 1))
	c := &flakyCatalog{Cache: e.cat}
	c.failReports.Store(1)
	b := e.broker(c, e.store)
	g := allocate(t, b, req("default"))

	err := b.Report(t.Context(), g.LeaseRef, catalog.OutcomeRateLimited, time.Hour)
	require.ErrorIs(t, err, broker.ErrCatalog)
	require.Equal(t, 1, e.live(t, "a"), "the lease is still held")
	require.Zero(t, e.get(t, "a").RateLimitHits)

	require.NoError(t, b.Report(t.Context(), g.LeaseRef, catalog.OutcomeRateLimited, time.Hour), "the retry works")
	require.Zero(t, e.live(t, "a"))
	k := e.get(t, "a")
	require.Equal(t, int64(1), k.RateLimitHits)
	require.Equal(t, optimistic.StatusRateLimited, e.info(t, "a").Status, "the store knows before the slot is free")
}

// A success report whose release met a store outage has not counted;
// retried, it finishes the release and counts (or finds the broker's
// background retry was first, and counts nothing): never twice.
func TestReportRetriedAfterFailedRelease(t *testing.T) {
	e, s, b := hooked(t, 1)
	g := allocate(t, b, req("default"))

	s.releaseDown.Store(true)
	err := b.Report(t.Context(), g.LeaseRef, catalog.OutcomeSuccess, 0)
	require.ErrorIs(t, err, optimistic.ErrStore)
	require.Zero(t, e.get(t, "a").Successes)
	s.releaseDown.Store(false)

	want := int64(1)
	err = b.Report(t.Context(), g.LeaseRef, catalog.OutcomeSuccess, 0)
	if err != nil {
		require.ErrorIs(t, err, optimistic.ErrLeaseLost, "only the background retry may have been first")
		want = 0
	}
	eventually(t, "released", func() bool { return e.live(t, "a") == 0 })
	require.Equal(t, want, e.get(t, "a").Successes)
	require.ErrorIs(t, b.Report(t.Context(), g.LeaseRef, catalog.OutcomeSuccess, 0), optimistic.ErrLeaseLost)
	require.Equal(t, want, e.get(t, "a").Successes, "never counted twice")
}

// A release that met a store outage comes back as soon as the store does,
// not at the lease's expiry; meanwhile a full pool is the store's fault
// (ErrStore, 503), not "full" (429).
func TestFailedReleasesAreRetried(t *testing.T) {
	e, s, b := hooked(t, 1)
	g := allocate(t, b, req("default"))

	s.releaseDown.Store(true)
	require.ErrorIs(t, b.Release(t.Context(), g.LeaseRef), optimistic.ErrStore)
	require.Equal(t, 1, b.Backlog().Pending)
	_, err := b.Allocate(t.Context(), req("default"))
	require.ErrorIs(t, err, optimistic.ErrStore)
	require.NotErrorIs(t, err, optimistic.ErrNoCapacity)

	s.releaseDown.Store(false)
	eventually(t, "released in the background", func() bool { return b.Backlog().Pending == 0 })
	require.Equal(t, broker.Backlog{Released: 1}, b.Backlog())
	require.Zero(t, e.live(t, "a"))
	allocate(t, b, req("default"))
}

// stuckPool returns a broker whose pool has keys a and dead, of limit 1,
// each taken by a lease whose release failed and waits in the backlog;
// releases on dead keep failing, those on a will not once the test
// clears releaseDown.
func stuckPool(t *testing.T) (*hookStore, *broker.Broker) {
	t.Helper()
	e := newEnv(t, key("a", "default", 1), key("dead", "default", 1))
	s := &hookStore{Store: e.store}
	b := e.broker(e.cat, twoServers{s})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		b.Close(ctx)
	})
	g1, g2 := allocate(t, b, req("default")), allocate(t, b, req("default"))
	s.releaseDown.Store(true)
	require.Error(t, b.Release(t.Context(), g1.LeaseRef))
	require.Error(t, b.Release(t.Context(), g2.LeaseRef))
	dead := "dead"
	s.downKey.Store(&dead)
	return s, b
}

// A pool full only because releases wait for the store asks again once
// some of them went through, though others still wait for a server that
// does not answer (a Redis Cluster master down).
func TestFullPoolFlushesWhatItCan(t *testing.T) {
	s, b := stuckPool(t)
	s.releaseDown.Store(false)
	g, err := b.Allocate(t.Context(), req("default"))
	require.NoError(t, err, "the release that went through made room")
	require.Equal(t, "a", g.KeyID)
	require.Equal(t, 1, b.Backlog().Pending, "dead's still waits")
}

// The same when the background retry, not the allocate's own round,
// took the release back between the store's "full" and the allocate's
// flush: the allocate asks again.
func TestFullPoolSeesBackgroundReleases(t *testing.T) {
	s, b := stuckPool(t)
	var once atomic.Bool
	s.fault = func(optimistic.AllocateRequest) error {
		if once.Swap(true) {
			return nil
		}
		// The store read the pool full; the background round then takes
		// a's release back.
		eventually(t, "a released in the background", func() bool { return b.Backlog().Released == 1 })
		return &optimistic.CapacityError{}
	}
	s.releaseDown.Store(false)
	g, err := b.Allocate(t.Context(), req("default"))
	require.NoError(t, err, "asked again")
	require.Equal(t, "a", g.KeyID)
}

// Close makes one last attempt; what still fails is left to expire.
func TestCloseRetriesOnce(t *testing.T) {
	e, s, b := hooked(t, 2)
	g1, g2 := allocate(t, b, req("default")), allocate(t, b, req("default"))
	s.releaseDown.Store(true)
	require.Error(t, b.Release(t.Context(), g1.LeaseRef))
	s.releaseDown.Store(false)
	b.Close(t.Context())
	require.Equal(t, 1, e.live(t, "a"), "the pending release was made at Close")

	s.releaseDown.Store(true)
	require.Error(t, b.Release(t.Context(), g2.LeaseRef))
	require.Equal(t, int64(1), b.Backlog().Dropped, "after Close nothing is kept")
}

// The backlog is bounded: past it a failed release is counted as dropped
// and its lease expires by itself.
func TestBacklogIsBounded(t *testing.T) {
	_, s, b := hooked(t, 1)
	s.releaseDown.Store(true)
	const over = 10_005
	for i := range over {
		ref := optimistic.LeaseRef{Provider: provider, Pool: "default", KeyID: "a", LeaseID: "l" + strconv.Itoa(i)}
		require.Error(t, b.Release(t.Context(), ref))
	}
	got := b.Backlog()
	require.Equal(t, over, got.Pending+int(got.Dropped))
	require.Equal(t, int64(5), got.Dropped)
}

// A request id keeps answering with its lease while the lease lives, also
// past its first expiry once renewed, and refuses other parameters.
func TestRequestIDFollowsItsLease(t *testing.T) {
	e := newEnv(t, key("a", "default", 2), key("v", "vip", 1))
	b := e.plain()
	r := req("default")
	r.RequestID, r.TTL = "r1", 1200*time.Millisecond
	g := allocate(t, b, r)
	_, err := b.Renew(t.Context(), g.LeaseRef, time.Hour)
	require.NoError(t, err)
	time.Sleep(1300 * time.Millisecond) // past the lease's first expiry

	again := allocate(t, b, r)
	require.Equal(t, g.LeaseID, again.LeaseID, "the renewed lease still answers its id")
	require.Equal(t, 1, e.live(t, "a"), "no second slot")

	other := r
	other.Pool = "vip"
	_, err = b.Allocate(t.Context(), other)
	require.ErrorIs(t, err, requestlog.ErrReused)
	other = r
	other.Model = "gpt-4o-mini"
	_, err = b.Allocate(t.Context(), other)
	require.ErrorIs(t, err, requestlog.ErrReused)
	require.Equal(t, 1, e.live(t, "a"))
	require.Zero(t, e.live(t, "v"))
}

// Close keeps to its ctx even while the store hangs a round and ignores
// the round's deadline: what is left is left to expire. A Close that
// waited for the store would never return here.
func TestCloseKeepsToItsDeadline(t *testing.T) {
	_, s, b := hooked(t, 1)
	s.releaseDown.Store(true)
	for i := range 50 {
		ref := optimistic.LeaseRef{Provider: provider, Pool: "default", KeyID: "a", LeaseID: "l" + strconv.Itoa(i)}
		require.Error(t, b.Release(t.Context(), ref))
	}
	<-s.hang(t) // the background retry is stuck in the store until the test ends
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		b.Close(ctx)
		close(done)
	}()
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for the store past its ctx")
	}
	require.Equal(t, 50, b.Backlog().Pending, "left to expire")
}

// A pool full only because of releases that waited for the store is
// answered by a grant as soon as the store takes them, without waiting
// for the background retry.
func TestStuckReleasesFlushedOnDemand(t *testing.T) {
	_, s, b := hooked(t, 1)
	g := allocate(t, b, req("default"))
	s.releaseDown.Store(true)
	require.Error(t, b.Release(t.Context(), g.LeaseRef))
	s.releaseDown.Store(false)
	allocate(t, b, req("default"))
	require.Equal(t, broker.Backlog{Released: 1}, b.Backlog())
}

// A report of a lease no longer held changes nothing, whatever its
// outcome: nothing proves the caller held it.
func TestReportOfALeaseNoLongerHeldRecordsNothing(t *testing.T) {
	e := newEnv(t, key("a", "default", 1))
	b := e.broker(e.cat, e.store)
	g := allocate(t, b, req("default"))
	require.NoError(t, b.Release(t.Context(), g.LeaseRef))
	for _, o := range []catalog.Outcome{catalog.OutcomeAuthError, catalog.OutcomeRateLimited, catalog.OutcomeError} {
		err := b.Report(t.Context(), g.LeaseRef, o, time.Hour)
		require.ErrorIs(t, err, optimistic.ErrLeaseLost, o)
	}
	k := e.get(t, "a")
	require.Equal(t, optimistic.StatusAvailable, k.Status)
	require.Zero(t, k.Errors)
	require.Zero(t, k.RateLimitHits)
	allocate(t, b, req("default"))
}
