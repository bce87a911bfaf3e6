package optimistic

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/test/redistest"
)

// decide is the WATCH callback's body: it must change nothing but the
// transaction and the verdict it returns; try applies the verdict once the
// transaction is over.
func TestDecideLeavesCallStateAlone(t *testing.T) {
	s, err := New(redistest.Start(t).Client(t), nil)
	require.NoError(t, err)
	ctx := t.Context()
	for _, k := range []KeyState{
		{ID: "free", Provider: "p", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 2},
		{ID: "full", Provider: "p", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 1},
	} {
		require.NoError(t, s.SyncKey(ctx, k))
	}
	held, _, err := s.Allocate(ctx, AllocateRequest{Provider: "p", Pool: "default", Candidates: []string{"full"}, TTL: time.Minute})
	require.NoError(t, err)

	req := AllocateRequest{Provider: "p", Pool: "default", Candidates: []string{"free", "full"}, TTL: time.Minute}
	newCall := func(leaseID, pending string) (*allocation, *Stats) {
		var st Stats
		return &allocation{Store: s, req: req, leaseID: leaseID, stats: &st, todo: req.Candidates, pending: pending}, &st
	}
	// decideOn runs decide in a transaction, checks that it left every
	// field of the call as it was, and returns its verdict.
	decideOn := func(a *allocation, st *Stats, keyID string) verdict {
		t.Helper()
		before, stats := *a, *st
		before.todo = append([]string(nil), a.todo...)
		var v verdict
		err := s.watch(ctx, []string{s.keys.Key(keyID), s.keys.Leases(keyID)}, func(tx *txn) (err error) {
			v, err = a.decide(ctx, tx, keyID)
			return err
		})
		require.NoError(t, err)
		require.Equal(t, before, *a, "the call's state (todo, full, pending, lease, ...)")
		require.Equal(t, stats, *st)
		return v
	}

	a, st := newCall("0f8fad5b-d9cb-469f-a165-70867728950e", "")
	// A skip after another one, so that there is something to keep.
	a.full = CapacityError{FreeAt: held.Until.Add(time.Hour), Held: false}
	v := decideOn(a, st, "full")
	require.Equal(t, verdict{settled: true, full: true, free: held.Until.UnixMilli(), held: true}, v, "skipped: full, free when its lease ends")

	v = decideOn(a, st, "free")
	require.True(t, v.granted)
	require.Positive(t, v.fence)
	granted := v
	infos, err := s.Inspect(ctx, "free")
	require.NoError(t, err)
	require.Equal(t, 1, infos[0].Live)

	// A call whose EXEC on "free" committed though its reply was lost
	// rechecks "free" and adopts that lease, fence and grant count
	// included, and still changes nothing.
	b, st := newCall(a.leaseID, "free")
	v = decideOn(b, st, "free")
	require.Equal(t, verdict{granted: true, until: granted.until, fence: granted.fence, seq: granted.seq}, v)
	infos, err = s.Inspect(ctx, "free")
	require.NoError(t, err)
	require.Equal(t, 1, infos[0].Live, "no second slot")
	require.Equal(t, granted.fence, infos[0].Fence)
}
