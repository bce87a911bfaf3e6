package optimistic

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	rs "github.com/credpool/credpool/internal/redisschema"
	"github.com/credpool/credpool/test/redistest"
)

// Redis restarts from a snapshot older than its last grants (saved
// before the key's first grant: only the count SyncKey started the new
// HASH with is in it). The leases granted since are gone from the store
// while their holders still use them. The process that saw a higher
// count, by its own grant or by a read, finds the key behind at its next
// read and holds it back for LostHold in the store, so that a process
// that saw nothing refuses it too; then grants resume, with fences above
// every one given. At no time are there more holders than the limit.
func TestLossIsHeldBack(t *testing.T) {
	for _, c := range []struct {
		name string
		// find reads the key, in the process that saw the lost grants,
		// after the restart.
		find func(t *testing.T, s *Store)
	}{
		{"by a grant", func(t *testing.T, s *Store) {
			_, _, err := s.Allocate(t.Context(), lostReq())
			requireHeld(t, err)
		}},
		{"by a read", func(t *testing.T, s *Store) {
			infos, err := s.Inspect(t.Context(), "k")
			require.NoError(t, err)
			require.WithinDuration(t, time.Now().Add(lostHold), infos[0].HeldUntil, 2*time.Second)
			require.Equal(t, infos[0].HeldUntil, infos[0].FreeAt)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.Start(t)
			ctx := t.Context()
			open := func(addr string) *Store { return lostStore(t, addr) }
			granter, reader := open(srv.Addr), open(srv.Addr)
			require.NoError(t, granter.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 2}))
			require.NoError(t, srv.Client(t).Save(ctx).Err())
			var held []Lease
			for range 2 {
				l, _, err := granter.Allocate(ctx, lostReq())
				require.NoError(t, err)
				held = append(held, l)
			}
			_, err := reader.Inspect(ctx, "k") // reads the second grant's count
			require.NoError(t, err)

			srv = srv.Restart(t)
			infos, err := open(srv.Addr).Inspect(ctx, "k")
			require.NoError(t, err)
			require.Zero(t, infos[0].Live, "the restart lost both leases")
			finder := granter
			if c.name == "by a read" {
				finder = reader
			}
			before := time.Now()
			c.find(t, finder)

			// Every process refuses it now: the one that found it, the
			// other that saw the grants, and one that saw nothing.
			for _, s := range []*Store{granter, reader, open(srv.Addr)} {
				_, _, err := s.Allocate(ctx, lostReq())
				requireHeld(t, err)
			}
			infos, err = open(srv.Addr).Inspect(ctx, "k")
			require.NoError(t, err)
			require.WithinDuration(t, before.Add(lostHold), infos[0].HeldUntil, 2*time.Second)

			time.Sleep(time.Until(infos[0].HeldUntil) + 50*time.Millisecond)
			for _, s := range []*Store{granter, reader} {
				l, _, err := s.Allocate(ctx, lostReq())
				require.NoError(t, err, "the hold is over, and held once")
				require.Greater(t, l.Fence, held[1].Fence, "fencing tokens never go back")
			}
		})
	}
}

// A read that finds a loss but cannot hold the key back (the server
// refuses writes for the moment) still answers, without a hold; the key
// stays behind for this process, so its next read holds it.
func TestFailedHoldIsMadeAtTheNextRead(t *testing.T) {
	srv := redistest.Start(t)
	ctx := t.Context()
	s := lostStore(t, srv.Addr)
	require.NoError(t, s.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 2}))
	require.NoError(t, srv.Client(t).Save(ctx).Err())
	for range 2 {
		_, _, err := s.Allocate(ctx, lostReq())
		require.NoError(t, err)
	}
	srv = srv.Restart(t)
	admin := srv.Client(t)
	require.NoError(t, admin.ConfigSet(ctx, "min-replicas-to-write", "1").Err())
	infos, err := s.Inspect(ctx, "k")
	require.NoError(t, err, "a read need not fail for the hold")
	require.Zero(t, infos[0].HeldUntil, "not held: the write was refused")
	require.Zero(t, infos[0].Live)
	stats, err := admin.Info(ctx, "errorstats").Result()
	require.NoError(t, err)
	require.Contains(t, stats, "errorstat_NOREPLICAS", "the hold was tried, and refused")

	require.NoError(t, admin.ConfigSet(ctx, "min-replicas-to-write", "0").Err())
	infos, err = s.Inspect(ctx, "k")
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(lostHold), infos[0].HeldUntil, 2*time.Second, "held by the next read")
	_, _, err = s.Allocate(ctx, lostReq())
	requireHeld(t, err)
}

// A process that saw none of the lost grants grants first after the
// restart: the key's grant count goes up by one, still below the count
// the process that made the lost grants saw, which finds the key behind
// at its next read and holds it back, for both. (A fence, which jumps to
// the clock at each grant, would have hidden the loss from it.)
func TestLossIsFoundAfterAnotherGrants(t *testing.T) {
	srv := redistest.Start(t)
	ctx := t.Context()
	granter, other := lostStore(t, srv.Addr), lostStore(t, srv.Addr)
	require.NoError(t, granter.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 3}))
	require.NoError(t, srv.Client(t).Save(ctx).Err())
	for range 2 {
		_, _, err := granter.Allocate(ctx, lostReq())
		require.NoError(t, err)
	}
	srv.Restart(t)
	_, _, err := other.Allocate(ctx, lostReq())
	require.NoError(t, err, "it saw nothing to miss")
	infos, err := granter.Inspect(ctx, "k")
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(lostHold), infos[0].HeldUntil, 2*time.Second, "found behind")
	_, _, err = other.Allocate(ctx, lostReq())
	requireHeld(t, err)
}

// A key deleted and synced again starts its grant count from the clock,
// so a process that saw its old counts does not find it behind (as long
// as the server's clock has not gone back; the process that deleted it
// forgets them anyway).
func TestKeyMadeAgainIsNotBehind(t *testing.T) {
	a, b := waitStores(t, false)
	ctx := t.Context()
	_, _, err := a.Allocate(ctx, waitReq(0))
	require.NoError(t, err)
	_, err = b.Inspect(ctx, "k")
	require.NoError(t, err)
	old := b.seqs.last("k")
	require.Positive(t, old)
	require.NoError(t, a.DeleteKey(ctx, "k"))
	require.Zero(t, a.seqs.last("k"), "the deleting process forgets the old counts")
	require.NoError(t, a.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 1}))
	seq, err := a.rdb.HGet(ctx, a.keys.Key("k"), rs.FieldSeq).Int64()
	require.NoError(t, err)
	require.Greater(t, seq, old, "the new count starts above the old")
	for _, s := range []*Store{a, b} {
		infos, err := s.Inspect(ctx, "k")
		require.NoError(t, err)
		require.Zero(t, infos[0].HeldUntil)
	}
	_, _, err = b.Allocate(ctx, waitReq(0))
	require.NoError(t, err)
}

// With MinReplicas a read may see a grant that too few replicas
// acknowledged and that is then given back: a failover losing it is no
// loss. Only acknowledged grants count as seen there.
func TestReadsAreNotSeenWithMinReplicas(t *testing.T) {
	s := &Store{opts: Options{MinReplicas: 1}}
	s.sawRead("k", keyState{exists: true, seq: 7})
	require.Zero(t, s.seqs.last("k"))
	s.opts.MinReplicas = 0
	s.sawRead("k", keyState{exists: true, seq: 7})
	require.Equal(t, int64(7), s.seqs.last("k"))
}

// A cluster client that may send reads to replicas (which lag) reads the
// key HASH in Inspect without counting its grant count as seen, or a replica
// behind its master would look like a loss.
func TestReplicaReadsAreNotSeen(t *testing.T) {
	addr := redistest.StartCluster(t).Addr
	for _, c := range []struct {
		name string
		opts redis.ClusterOptions
		seen bool
	}{
		{"masters", redis.ClusterOptions{}, true},
		{"read only", redis.ClusterOptions{ReadOnly: true}, false},
		{"by latency", redis.ClusterOptions{RouteByLatency: true}, false},
		{"randomly", redis.ClusterOptions{RouteRandomly: true}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.opts.Addrs = []string{addr}
			granter := storeOn(t, redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}}))
			require.NoError(t, granter.SyncKey(t.Context(), KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 1000}))
			_, _, err := granter.Allocate(t.Context(), waitReq(0))
			require.NoError(t, err)
			reader := storeOn(t, redis.NewClusterClient(&c.opts))
			_, err = reader.Inspect(t.Context(), "k")
			require.NoError(t, err)
			if c.seen {
				require.Equal(t, granter.seqs.last("k"), reader.seqs.last("k"))
			} else {
				require.Zero(t, reader.seqs.last("k"))
			}
		})
	}
}

const lostHold = 3 * time.Second

// lostStore is a store on the server at addr that holds a key it finds
// behind for lostHold.
func lostStore(t *testing.T, addr string) *Store {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	s, err := New(rdb, &Options{LostHold: lostHold})
	require.NoError(t, err)
	return s
}

func lostReq() AllocateRequest {
	return AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Second}
}

// requireHeld asserts err is a capacity error that ends with a hold of
// about lostHold from now.
func requireHeld(t *testing.T, err error) {
	t.Helper()
	var full *CapacityError
	require.True(t, errors.As(err, &full), "want a capacity error, got %v", err)
	require.False(t, full.Held, "a hold's end is exact")
	require.WithinDuration(t, time.Now().Add(lostHold), full.FreeAt, 2*time.Second)
}

// A loss whose last lost grant was a handoff, met by the next handoff:
// the snapshot has the lease the first handoff replaced, and not the
// handoff. Released again, it would hand the fence the lost handoff gave
// (the HINCRBY counts from the snapshot's) to a second holder of a
// limit-1 key; the handoff is refused instead, and the caller's own try,
// which reads the count that handoff's HINCRBY left (the lost one's),
// still finds the key behind and holds it back: the caller gets nothing.
func TestHandoffOnALossIsRefused(t *testing.T) {
	srv := redistest.Start(t)
	s := storeOn(t, redis.NewClient(&redis.Options{Addr: srv.Addr}))
	ctx := t.Context()
	require.NoError(t, s.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 1}))
	held, second := primed(t, s)
	require.NoError(t, srv.Client(t).Save(ctx).Err())
	require.NoError(t, s.Release(ctx, held.LeaseRef))
	handed := second.result(t)
	require.NoError(t, handed.err)
	require.Zero(t, handed.stats.Attempts, "handed over")
	lost := s.seqs.last("k") // the handoff's count
	third := startWaiter(t, s, 1)

	srv.Restart(t)
	// A release of nothing hears who listens for the key: this store
	// alone, once it has subscribed again to the restarted server, so the
	// next release's slot is its callers' turn.
	gone := held.LeaseRef
	gone.LeaseID = "gone"
	require.Eventually(t, func() bool {
		return errors.Is(s.Release(ctx, gone), ErrLeaseLost) && s.notices.alone("k")
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, s.Release(ctx, held.LeaseRef), "the snapshot has it again")
	require.Eventually(t, func() bool {
		infos, err := s.Inspect(ctx, "k")
		return err == nil && !infos[0].HeldUntil.IsZero()
	}, 10*time.Second, 10*time.Millisecond, "held back")
	third.cancel()
	got := third.result(t)
	require.Error(t, got.err, "a second holder of the key: %+v", got.lease)
	require.Equal(t, lost+1, s.seqs.last("k"), "the count the handoff lost, and one")
}

// A grant recovered after its EXEC's reply was lost counts as seen, as
// any other grant does: the recheck's read, after that EXEC, has its
// count.
func TestRecoveredGrantIsSeen(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	s := storeOn(t, redis.NewClient(&redis.Options{Addr: proxy.Addr, DialerRetries: 1}))
	ctx := t.Context()
	require.NoError(t, s.SyncKey(ctx, KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 2}))
	proxy.CutNextExec()
	_, _, err := s.Allocate(ctx, waitReq(0))
	require.NoError(t, err)
	require.Equal(t, 1, proxy.Cuts())
	seq, err := srv.Client(t).HGet(ctx, s.keys.Key("k"), rs.FieldSeq).Int64()
	require.NoError(t, err)
	require.Equal(t, seq, s.seqs.last("k"))
}

// A call whose ctx ends while its EXEC's reply is on the wire (lost here)
// cannot recheck: it gives the lease back as it ends, so a slot the EXEC
// took is not held by nobody until the TTL. Whether the client stops
// reading at a deadline or at the hang-up, waiting or not.
func TestCallEndedDuringItsCommitGivesTheLeaseBack(t *testing.T) {
	srv := redistest.Start(t)
	for _, deadlines := range []bool{false, true} {
		for _, wait := range []time.Duration{0, 5 * time.Second} {
			proxy := redistest.NewProxy(t, srv.Addr)
			rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, DialerRetries: 1, ContextTimeoutEnabled: deadlines})
			s := storeOn(t, rdb)
			require.NoError(t, s.SyncKey(t.Context(), KeyState{ID: "k", Provider: "openai", Pool: "default", Status: StatusAvailable, MaxConcurrentUses: 1}))
			seq := func() int64 { n, _ := srv.Client(t).HGet(t.Context(), s.keys.Key("k"), rs.FieldSeq).Int64(); return n }
			before := seq()
			ctx, cancel := context.WithCancel(t.Context())
			end := &endDuringExec{end: cancel, deadline: deadlines}
			end.armed.Store(true)
			rdb.AddHook(end)
			proxy.CutNextExec()
			_, _, err := s.Allocate(ctx, waitReq(wait))
			require.ErrorIs(t, err, context.Canceled)
			require.Eventually(t, func() bool { return proxy.Cuts() == 1 }, 10*time.Second, time.Millisecond)
			require.Greater(t, seq(), before, "the EXEC ran")
			infos, err := s.Inspect(t.Context(), "k")
			require.NoError(t, err)
			require.Zero(t, infos[0].Live, "given back (deadlines %v, wait %v)", deadlines, wait)
			require.Empty(t, srv.Find(t, ":lease:"))
			_, _, err = s.Allocate(t.Context(), waitReq(0))
			require.NoError(t, err)
			require.NoError(t, srv.Client(t).FlushAll(t.Context()).Err())
		}
	}
}

// endDuringExec, once armed, ends the caller's ctx while the first EXEC's
// reply is awaited: with deadline, the read gives up after 50ms, as a
// client with ContextTimeoutEnabled does at a deadline; else it waits for
// the reply or the hang-up.
type endDuringExec struct {
	armed    atomic.Bool
	end      context.CancelFunc
	deadline bool
}

func (*endDuringExec) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (*endDuringExec) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *endDuringExec) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() == "exec" }) || !h.armed.CompareAndSwap(true, false) {
			return next(ctx, cmds)
		}
		if h.deadline {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
		}
		err := next(ctx, cmds)
		h.end()
		return err
	}
}

// A hold shorter than fenceFresh could let a handoff hand out a lost
// handoff's fence again once it ends: LostHold is at least that.
func TestLostHoldIsAtLeastFenceFresh(t *testing.T) {
	require.Equal(t, fenceFresh, (&Options{LostHold: time.Millisecond}).withDefaults().LostHold)
	require.Equal(t, time.Hour, (*Options)(nil).withDefaults().LostHold)
	require.Equal(t, lostHold, (&Options{LostHold: lostHold}).withDefaults().LostHold)
}
