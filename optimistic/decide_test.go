package optimistic

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/test/redistest"
)

// decide is the WATCH callback's body. go-redis may run the callback again
// (after a redirect), so decide must change nothing but the transaction
// and the verdict it returns; try applies the verdict once it is over.
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
	newCall := func(leaseID string) (*allocation, *Stats) {
		var st Stats
		return &allocation{Store: s, req: req, leaseID: leaseID, stats: &st, todo: req.Candidates}, &st
	}
	// decideOn runs decide in a transaction, twice as a re-run would, and
	// returns the last verdict.
	decideOn := func(a *allocation, keyID string) verdict {
		t.Helper()
		var v verdict
		for range 2 {
			err := s.watch(ctx, []string{s.keys.Key(keyID), s.keys.Leases(keyID)}, func(tx *txn) (err error) {
				v, err = a.decide(ctx, tx, keyID)
				return err
			})
			require.NoError(t, err)
		}
		return v
	}
	untouched := func(a *allocation, st *Stats) {
		t.Helper()
		require.Zero(t, a.free)
		require.Empty(t, a.pending)
		require.Equal(t, Lease{}, a.lease)
		require.Equal(t, Stats{}, *st)
	}

	a, st := newCall("0f8fad5b-d9cb-469f-a165-70867728950e")
	v := decideOn(a, "full")
	require.Equal(t, verdict{read: true, free: held.Until.UnixMilli(), held: true}, v, "skipped: when its lease ends")
	untouched(a, st)

	v = decideOn(a, "free")
	require.True(t, v.granted)
	require.Positive(t, v.fence)
	granted := v
	untouched(a, st)
	infos, err := s.Inspect(ctx, "free")
	require.NoError(t, err)
	require.Equal(t, 1, infos[0].Live, "the second run found its own lease, as after a lost EXEC reply")

	// Another call whose lease is already there (its EXEC committed, its
	// reply lost) recovers it, fence included, and still changes nothing.
	b, st := newCall(a.leaseID)
	v = decideOn(b, "free")
	require.Equal(t, verdict{read: true, granted: true, until: granted.until, fence: granted.fence}, v)
	untouched(b, st)
}
