package test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/redisschema"
	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/optimistic/leasetest"
	"github.com/credpool/credpool/test/redistest"
)

// topology is how the suite's client reaches its fresh redis-server.
type topology int

const (
	standalone topology = iota
	cluster             // a one-node cluster owning every slot
	ring                // a go-redis Ring of one shard: the store falls back to go-redis's own WATCH
)

// redisBackend wraps any store built on a fresh redis-server for the suite;
// each peer is another store of the same kind on a client of its own.
func redisBackend(t *testing.T, top topology, newStore func(t *testing.T, rdb redis.UniversalClient) optimistic.LeaseStore) leasetest.Backend {
	var srv *redistest.Server
	if top == cluster {
		srv = redistest.StartCluster(t)
	} else {
		srv = redistest.Start(t)
	}
	client := func(t *testing.T) redis.UniversalClient {
		if top != ring {
			return srv.Client(t)
		}
		r := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"only": srv.Addr}, DialerRetries: 1})
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	rdb := client(t)
	return leasetest.Backend{
		Store: newStore(t, rdb),
		Peer:  func(t *testing.T) optimistic.LeaseStore { return newStore(t, client(t)) },
		SetField: func(t *testing.T, keyID, field string, value *string) {
			t.Helper()
			name := redisschema.Schema{Prefix: redisschema.DefaultPrefix}.Key(keyID)
			var err error
			if value == nil {
				err = rdb.HDel(context.Background(), name, field).Err()
			} else {
				err = rdb.HSet(context.Background(), name, field, *value).Err()
			}
			require.NoError(t, err)
		},
		Find: func(t *testing.T, s string) []string { return srv.Find(t, s) },
		Stop: func(*testing.T) { srv.Stop() },
	}
}

func newOptimistic(t *testing.T, rdb redis.UniversalClient) optimistic.LeaseStore {
	s, err := optimistic.New(rdb, nil)
	require.NoError(t, err)
	return s
}

func TestOptimisticConformance(t *testing.T) {
	leasetest.Run(t, func(t *testing.T) leasetest.Backend { return redisBackend(t, standalone, newOptimistic) })
}

func TestOptimisticConformanceCluster(t *testing.T) {
	leasetest.Run(t, func(t *testing.T) leasetest.Backend { return redisBackend(t, cluster, newOptimistic) })
}

// Clients other than standalone, Sentinel and Cluster take go-redis's own
// WATCH path, where the commit goes through go-redis's TxPipelined: the
// contract holds there too.
func TestOptimisticConformanceRing(t *testing.T) {
	leasetest.Run(t, func(t *testing.T) leasetest.Backend { return redisBackend(t, ring, newOptimistic) })
}

func TestOptimisticStress(t *testing.T) {
	leasetest.Stress(t, func(t *testing.T) leasetest.Backend { return redisBackend(t, standalone, newOptimistic) }, 3*time.Second)
}

func newUngatedOptimistic(t *testing.T, rdb redis.UniversalClient) optimistic.LeaseStore {
	s, err := optimistic.New(rdb, &optimistic.Options{NoGate: true})
	require.NoError(t, err)
	return s
}

// The benchmark's optimistic-nogate keeps the contract: without the turn a
// process's own calls race in their transactions, and still never oversell.
func TestUngatedOptimisticConformance(t *testing.T) {
	leasetest.Run(t, func(t *testing.T) leasetest.Backend { return redisBackend(t, standalone, newUngatedOptimistic) })
}

func TestUngatedOptimisticStress(t *testing.T) {
	leasetest.Stress(t, func(t *testing.T) leasetest.Backend { return redisBackend(t, standalone, newUngatedOptimistic) }, 3*time.Second)
}

// A heartbeat never fails as contended, however hot the key: Renew writes
// without WATCH. The store here allows a single conflict retry, so a
// renewal that could conflict would soon run out.
func TestRenewNeverContends(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	store, err := optimistic.New(rdb, &optimistic.Options{MaxRetries: 1})
	require.NoError(t, err)
	ctx := t.Context()
	require.NoError(t, store.SyncKey(ctx, optimistic.KeyState{ID: "hot", Provider: "openai", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: 2}))
	req := optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"hot"}, TTL: time.Minute}
	held, _, err := store.Allocate(ctx, req)
	require.NoError(t, err)

	// Churn on the other slot from a second store, as another process
	// would: its grants and releases write the lease ZSET all the time.
	other, err := optimistic.New(rdb, nil)
	require.NoError(t, err)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if l, _, err := other.Allocate(ctx, req); err == nil {
					_ = other.Release(ctx, l.LeaseRef)
				}
			}
		})
	}
	for i := range 300 {
		_, err := store.Renew(ctx, held.LeaseRef, time.Minute)
		require.NoError(t, err, "renewal %d", i)
	}
	close(stop)
	wg.Wait()
}

// A lease written before the owner was part of its member (the bare lease
// id, its record named after it) expires harmlessly: it holds its slot
// until then, this version cannot release or renew it (lost, as for an
// unknown lease: its holder stops), and the first grant after its expiry
// prunes it with its record.
func TestOldFormatLeaseExpires(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store, err := optimistic.New(rdb, nil)
	require.NoError(t, err)
	ctx := t.Context()
	syncKey(t, store, "k", optimistic.StatusAvailable)
	keys := redisschema.Schema{Prefix: redisschema.DefaultPrefix}
	// The server runs on this host: its clock is ours.
	until := time.Now().Add(time.Second).UnixMilli()
	_, err = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, keys.Leases("k"), redis.Z{Score: float64(until), Member: "old-lease"})
		p.HSet(ctx, keys.Lease("k", "old-lease"), "key_id", "k", "provider", "openai", "pool", "default", "lease_until", until, "fence", 1)
		p.PExpireAt(ctx, keys.Lease("k", "old-lease"), time.UnixMilli(until).Add(time.Minute))
		return nil
	})
	require.NoError(t, err)
	ref := optimistic.LeaseRef{Provider: "openai", Pool: "default", KeyID: "k", LeaseID: "old-lease"}

	_, _, err = allocateK(ctx, store)
	require.ErrorIs(t, err, optimistic.ErrNoCapacity, "it holds its slot")
	_, err = store.Renew(ctx, ref, time.Minute)
	require.ErrorIs(t, err, optimistic.ErrLeaseLost)
	err = store.Release(ctx, ref)
	require.ErrorIs(t, err, optimistic.ErrLeaseLost)
	require.NotErrorIs(t, err, optimistic.ErrLeaseMismatch)
	require.Len(t, srv.Find(t, "old-lease"), 2, "neither refusal wrote")

	time.Sleep(time.Until(time.UnixMilli(until)) + 20*time.Millisecond)
	_, st, err := allocateK(ctx, store)
	require.NoError(t, err)
	require.Equal(t, 1, st.Pruned)
	require.Empty(t, srv.Find(t, "old-lease"), "pruned with its record")
}
