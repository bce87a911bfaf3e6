package bench_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/bench"
	"github.com/credpool/credpool/internal/redisproc"
	rs "github.com/credpool/credpool/internal/redisschema"
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
// On a Redis store each also reports the CPU time an op costs, on each
// side of the connection: this process (client-µs/op, its callers'
// bookkeeping included) and redis-server (redis-µs/op, from INFO cpu);
// and its round trips (roundtrips/op: commands and pipelines sent, as the
// harness counts them, with new connections' set-up too).
// Two cores shared by both, as on the benchmark's machine, give grants/s
// by their sum.
//
// watch-multi-bare is the spread op as a WATCH/MULTI client on go-redis
// must at least do it, with nothing of the optimistic store's (see
// bareStore): the gap between it and lua is what WATCH/MULTI costs, and
// between it and optimistic what the store adds. make bench-cpu runs these
// in alternated order.
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
	b.Run("watch-multi-bare/spread", func(b *testing.B) {
		// On the optimistic store's keys, which it syncs.
		s, err := bench.Select(bench.Strategies(), "optimistic")
		require.NoError(b, err)
		store := openStore(b, s[0], 256, 1).(measured)
		rdb, ok := store.rdb.(*redis.Client)
		require.True(b, ok, "a single server's client")
		bare := &bareStore{LeaseStore: store.LeaseStore, rdb: rdb, keys: rs.Schema{Prefix: prefix}}
		benchParallel(b, measured{bare, store.rdb, store.rt}, 256, 4)
	})
}

// prefix is the Redis stores' key prefix.
const prefix = "bench"

// measured is a Redis store whose benchmark reports CPU time and round
// trips per op: rt counts rdb's.
type measured struct {
	optimistic.LeaseStore
	rdb redis.UniversalClient
	rt  *redisproc.RoundTrips
}

// openStore opens s on a fresh server or file with keys keys of limit
// limit: a Redis store is measured.
func openStore(b *testing.B, s bench.Strategy, keys, limit int) optimistic.LeaseStore {
	b.Helper()
	var t bench.Target
	if s.Redis {
		t = bench.Target{Redis: redistest.Start(b).Client(b), Prefix: prefix}
	} else {
		db, err := sqlitex.Open(filepath.Join(b.TempDir(), "leases.db"))
		require.NoError(b, err)
		b.Cleanup(func() { _ = db.Close() })
		t = bench.Target{DB: db}
	}
	var rt redisproc.RoundTrips
	if s.Redis {
		t.Redis.AddHook(&rt)
	}
	store, err := s.Open(context.Background(), t)
	require.NoError(b, err)
	syncKeys(b, store, keys, limit)
	if s.Redis {
		return measured{store, t.Redis, &rt}
	}
	return store
}

// syncKeys adds keys keys of limit limit to store.
func syncKeys(b *testing.B, store optimistic.LeaseStore, keys, limit int) {
	b.Helper()
	for i := range keys {
		require.NoError(b, store.SyncKey(context.Background(), optimistic.KeyState{
			ID: keyID(i), Provider: "bench", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: limit,
		}))
	}
}

// meter reads the CPU time spent since it started, by this process and by
// the redis-server a measured store talks to, and the store's round trips.
// It is used by one goroutine.
type meter struct {
	measured
	client, server float64 // seconds at the start
}

// startMeter starts a meter on store if it is measured, else returns nil.
func startMeter(b *testing.B, store optimistic.LeaseStore) *meter {
	b.Helper()
	m, ok := store.(measured)
	if !ok {
		return nil
	}
	started := &meter{measured: m, client: processCPU(b), server: serverCPU(b, m.rdb)}
	m.rt.Reset()
	return started
}

// report adds the CPU time and round trips per op to b's metrics.
func (m *meter) report(b *testing.B) {
	b.Helper()
	if m == nil {
		return
	}
	n := float64(b.N)
	b.ReportMetric(float64(m.rt.Total())/n, "roundtrips/op")
	b.ReportMetric((processCPU(b)-m.client)*1e6/n, "client-µs/op")
	b.ReportMetric((serverCPU(b, m.rdb)-m.server)*1e6/n, "redis-µs/op")
}

// serverCPU is the CPU time, in seconds, that the server of rdb has spent.
func serverCPU(b *testing.B, rdb redis.UniversalClient) float64 {
	b.Helper()
	info, err := rdb.Info(context.Background(), "cpu").Result()
	require.NoError(b, err)
	var total float64
	for line := range strings.Lines(info) {
		name, value, _ := strings.Cut(strings.TrimSpace(line), ":")
		if name == "used_cpu_sys" || name == "used_cpu_user" {
			v, err := strconv.ParseFloat(value, 64)
			require.NoError(b, err)
			total += v
		}
	}
	return total
}

func keyID(i int) string { return "k" + strconv.Itoa(i) }

// keyIDs are keyID(0) to keyID(255), so that drawing candidates costs the
// benchmark's callers little of the CPU measured.
var keyIDs = func() []string {
	ids := make([]string, 256)
	for i := range ids {
		ids[i] = keyID(i)
	}
	return ids
}()

func request(candidates []string) optimistic.AllocateRequest {
	return optimistic.AllocateRequest{Provider: "bench", Pool: "default", Candidates: candidates, TTL: time.Minute}
}

func benchSerial(b *testing.B, store optimistic.LeaseStore) {
	ctx := context.Background()
	req := request([]string{keyID(0)})
	gauge := startMeter(b, store)
	defer gauge.report(b)
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
// keys out of keys (at most len(keyIDs)).
func benchParallel(b *testing.B, store optimistic.LeaseStore, keys, candidates int) {
	ctx := context.Background()
	var grants, conflicts atomic.Int64
	var seed atomic.Uint64
	b.SetParallelism(8)
	b.ResetTimer()
	gauge := startMeter(b, store)
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(seed.Add(1), 0))
		for pb.Next() {
			ids := make([]string, 0, candidates)
			for len(ids) < candidates {
				if id := keyIDs[rng.IntN(keys)]; !slices.Contains(ids, id) {
					ids = append(ids, id)
				}
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
	gauge.report(b)
	b.ReportMetric(float64(grants.Load())/float64(b.N), "grants/op")
	b.ReportMetric(float64(conflicts.Load())/float64(b.N), "conflicts/op")
}

// processCPU is the CPU time, in seconds, this process has spent.
func processCPU(b *testing.B) float64 {
	b.Helper()
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}
