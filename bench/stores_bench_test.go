package bench_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/bench"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/test/redistest"
)

// BenchmarkAllocateRelease measures one allocate and its release on every
// lease store, as sub-benchmarks:
//
//   - uncontended: one caller, one key;
//   - hot: 16 parallel callers on one key of limit 4, holding nothing, so
//     every call races for the same ZSET (metrics: grants and conflicts per
//     op, where an op is one allocate and, if granted, its release);
//   - spread: 16 parallel callers, 4 candidates each out of 256 keys.
//
// Run with: go test -run '^$' -bench AllocateRelease ./bench/
func BenchmarkAllocateRelease(b *testing.B) {
	for _, s := range bench.Strategies() {
		b.Run(s.Name, func(b *testing.B) {
			b.Run("uncontended", func(b *testing.B) {
				store := openStore(b, s, 1, 1)
				benchSerial(b, store)
			})
			b.Run("hot", func(b *testing.B) {
				store := openStore(b, s, 1, 4)
				benchParallel(b, store, 1, 1)
			})
			b.Run("spread", func(b *testing.B) {
				store := openStore(b, s, 256, 1)
				benchParallel(b, store, 256, 4)
			})
		})
	}
}

// openStore opens s on a fresh server or file with keys keys of limit limit.
func openStore(b *testing.B, s bench.Strategy, keys, limit int) optimistic.LeaseStore {
	b.Helper()
	var t bench.Target
	if s.Redis {
		t = bench.Target{Redis: redistest.Start(b).Client(b), Prefix: "bench"}
	} else {
		db, err := sqlitex.Open(filepath.Join(b.TempDir(), "leases.db"))
		require.NoError(b, err)
		b.Cleanup(func() { _ = db.Close() })
		t = bench.Target{DB: db}
	}
	store, err := s.Open(context.Background(), t)
	require.NoError(b, err)
	for i := range keys {
		require.NoError(b, store.SyncKey(context.Background(), optimistic.KeyState{
			ID: keyID(i), Provider: "bench", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: limit,
		}))
	}
	return store
}

func keyID(i int) string { return "k" + strconv.Itoa(i) }

func request(candidates []string) optimistic.AllocateRequest {
	return optimistic.AllocateRequest{Provider: "bench", Pool: "default", Candidates: candidates, TTL: time.Minute}
}

func benchSerial(b *testing.B, store optimistic.LeaseStore) {
	ctx := context.Background()
	req := request([]string{keyID(0)})
	for b.Loop() {
		l, _, err := store.Allocate(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if err := store.Release(ctx, l.LeaseRef); err != nil {
			b.Fatal(err)
		}
	}
}

// benchParallel runs 8 callers per GOMAXPROCS, each with candidates random
// keys out of keys.
func benchParallel(b *testing.B, store optimistic.LeaseStore, keys, candidates int) {
	ctx := context.Background()
	var grants, conflicts atomic.Int64
	var seed atomic.Uint64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(seed.Add(1), 0))
		for pb.Next() {
			ids := make([]string, 0, candidates)
			for _, i := range rng.Perm(keys)[:candidates] {
				ids = append(ids, keyID(i))
			}
			l, st, err := store.Allocate(ctx, request(ids))
			conflicts.Add(int64(st.Conflicts))
			switch {
			case err == nil:
				grants.Add(1)
				if err := store.Release(ctx, l.LeaseRef); err != nil {
					b.Error(err)
					return
				}
			case errors.Is(err, optimistic.ErrNoCapacity), errors.Is(err, optimistic.ErrContended):
			default:
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(grants.Load())/float64(b.N), "grants/op")
	b.ReportMetric(float64(conflicts.Load())/float64(b.N), "conflicts/op")
}
