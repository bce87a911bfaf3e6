package bench

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/bench/report"
	"github.com/credpool/credpool/bench/workload"
	"github.com/credpool/credpool/internal/redisproc"
	"github.com/credpool/credpool/optimistic"
)

func TestShareSplitsCallersCallsAndRate(t *testing.T) {
	spec := workload.Spec{Workers: 65, Ops: 1001, Rate: 3000}
	var workers int
	var ops int64
	for p := range 2 {
		s := share(spec, 2, p)
		workers += s.Workers
		ops += s.Ops
		require.InDelta(t, 1500, s.Rate, 1e-9)
	}
	require.Equal(t, 65, workers)
	require.Equal(t, int64(1001), ops)
	require.Equal(t, 33, share(spec, 2, 0).Workers, "the remainder goes to the first processes")
	require.Zero(t, share(workload.Spec{Workers: 8}, 2, 1).Ops, "no op count stays none")
}

// Over two cells of three repetitions each order runs first three times,
// and every cell alternates.
func TestReversedEvensOutOddReps(t *testing.T) {
	var got [][]bool
	for cell := range 2 {
		var reps []bool
		for rep := range 3 {
			reps = append(reps, reversed(cell, rep))
		}
		got = append(got, reps)
	}
	require.Equal(t, [][]bool{{false, true, false}, {true, false, true}}, got)
}

func TestGridCells(t *testing.T) {
	g := Standard()
	cells, err := g.Cells()
	require.NoError(t, err)
	// 4 scenarios × 2 pauses × 2 limits × 2 process counts.
	require.Len(t, cells, 32)
	for _, c := range cells {
		require.GreaterOrEqual(t, c.Spec.Workers, c.Procs)
		require.NoError(t, c.Spec.Validate())
	}
	require.Equal(t, Cell{Scenario: "uniform", Procs: 1, Spec: workload.Spec{
		Keys: 1000, Limit: 1, Candidates: 4, Choice: workload.Uniform, Order: workload.Ranked, Workers: 64,
		Hold: time.Millisecond, HoldDist: workload.Exponential, Duration: 3 * time.Second, TTL: 10 * time.Second,
		Pause: time.Millisecond,
	}}, cells[0])
	require.Equal(t, 5*time.Millisecond, cells[4].Spec.Pause, "pauses outside limits, procs and workers")

	g.Rates = []float64{0, 1000}
	cells, err = g.Cells()
	require.NoError(t, err)
	require.Len(t, cells, 48, "an open loop never pauses: one cell whatever the pauses")
	for _, c := range cells {
		if c.Spec.Rate > 0 {
			require.Zero(t, c.Spec.Pause)
		}
	}
	g.Rates = []float64{0}

	g.Waits = []time.Duration{0, 10 * time.Second}
	cells, err = g.Cells()
	require.NoError(t, err)
	require.Len(t, cells, 48, "waiting callers never pause: one cell whatever the pauses")
	for i, c := range cells[:12] {
		want := [...]time.Duration{0, 0, 0, 0, 0, 0, 0, 0, 10 * time.Second, 10 * time.Second, 10 * time.Second, 10 * time.Second}[i]
		require.Equal(t, want, c.Spec.Wait, "cell %d: waits outside pauses, inside scenarios", i)
		if c.Spec.Wait > 0 {
			require.Zero(t, c.Spec.Pause)
		}
	}
	g.Rates = []float64{0, 1000}
	cells, err = g.Cells()
	require.NoError(t, err)
	require.Len(t, cells, 64, "an open loop has no waiting callers: its waiting cells are left out")
	g.Rates, g.Waits = []float64{0}, nil

	g.Keys, g.Candidates = 3, 5
	cells, err = g.Cells()
	require.NoError(t, err)
	require.Equal(t, 3, cells[0].Spec.Candidates, "candidates are capped at the keys")

	for _, bad := range []func(*Grid){
		func(g *Grid) { g.Scenarios = []string{"everything"} },
		func(g *Grid) { g.Workers = []int{1}; g.Procs = []int{2} },
		func(g *Grid) { g.Ops = 1 },
		func(g *Grid) { g.HoldDist = "normal" },
		func(g *Grid) { g.Pauses = nil },
	} {
		g := Standard()
		bad(&g)
		_, err := g.Cells()
		require.Error(t, err)
	}
}

func TestSelect(t *testing.T) {
	got, err := Select(Strategies(), "sqlite, optimistic")
	require.NoError(t, err)
	require.Equal(t, "sqlite", got[0].Name)
	require.Equal(t, "optimistic", got[1].Name)
	_, err = Select(Strategies(), "optimistic,etcd")
	require.ErrorContains(t, err, `unknown strategy "etcd"`)
	_, err = Select(Strategies(), "lua,lua")
	require.Error(t, err)
}

func TestCommandStats(t *testing.T) {
	before := parseCommandStats("# Commandstats\r\n" +
		"cmdstat_evalsha:calls=10,usec=100,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_hello:calls=3,usec=3,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r\n")
	require.Equal(t, map[string]int64{"evalsha": 10, "hello": 3}, before)
	after := parseCommandStats("# Commandstats\r\n" +
		"cmdstat_evalsha:calls=25,usec=100,usec_per_call=4.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_time:calls=15,usec=1,usec_per_call=0.07,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_hello:calls=9,usec=3,usec_per_call=0.33,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_client|setinfo:calls=12,usec=3,usec_per_call=0.25,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=2,usec=30,usec_per_call=15.00,rejected_calls=0,failed_calls=0\r\n")
	delta, total := commandDelta(before, after)
	require.Equal(t, map[string]int64{"evalsha": 15, "time": 15}, delta, "connection set-up and INFO are not counted")
	require.Equal(t, int64(30), total)
}

// go-redis sends a new connection's set-up (HELLO, CLIENT SETINFO and
// more) through the client's hooks: none of it is a round trip of the
// run's, on a pooled connection or a pub/sub one.
func TestRoundTripsLeaveOutSetUp(t *testing.T) {
	ctx := t.Context()
	srv, err := startRedis(ctx, "", false, false)
	require.NoError(t, err)
	t.Cleanup(srv.stop)
	rt := &redisproc.RoundTrips{}
	rdb, err := location{RedisURL: srv.url, PoolSize: 2}.redis(rt)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rdb.Close()) })

	require.NoError(t, rdb.Set(ctx, "k", "v", 0).Err())
	require.Equal(t, int64(1), rt.Total(), "one command on a new connection")
	_, err = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Get(ctx, "k")
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, int64(2), rt.Total(), "one transaction")
	sub := rdb.SSubscribe(ctx, "{k}:ch")
	_, err = sub.Receive(ctx)
	require.NoError(t, err)
	require.NoError(t, sub.Close())
	require.Equal(t, int64(2), rt.Total(), "nor the pub/sub connection's set-up")
}

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:6379": true, "127.3.2.1:6379": true, "[::1]:6379": true, "localhost:6379": true, ":6379": true,
		"10.0.0.5:6379": false, "redis.example.com:6379": false, "192.168.1.2:6379": false,
	} {
		require.Equal(t, want, loopback(&redis.Options{Addr: addr}), addr)
	}
	require.True(t, loopback(&redis.Options{Network: "unix", Addr: "/run/redis.sock"}))
}

// A worker whose stdout ends while it still writes to stderr is described
// by the end of what it wrote so far; reading that while exec copies more
// must not race (the race detector fails this test if it does).
func TestFailedWorkerStderrWhileWriting(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	p, err := startProc(ctx, []string{"/bin/sh", "-c", "exec >&-; while :; do echo noise >&2; done"}, nil, job{})
	if err == nil {
		_, err = p.receive()
	}
	require.ErrorContains(t, err, "bench: worker process")
	cancel()
	if p != nil {
		_ = p.cmd.Wait()
	}
}

// The conflicts count is read from the service's metrics, and a metrics
// page without it, or no metrics page, is an error, never a zero.
func TestServiceConflicts(t *testing.T) {
	page := "# TYPE credpool_allocate_conflicts_total counter\ncredpool_allocate_conflicts_total 1.234567e+06\n"
	code := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, "/metrics", r.URL.Path)
		w.WriteHeader(code)
		_, _ = io.WriteString(w, page)
	}))
	t.Cleanup(srv.Close)
	s := &service{base: srv.URL, client: srv.Client()}
	n, err := s.conflicts(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(1234567), n)

	page = "# TYPE credpool_allocations_total counter\ncredpool_allocations_total{result=\"granted\"} 3\n"
	_, err = s.conflicts(t.Context())
	require.ErrorContains(t, err, "no credpool_allocate_conflicts_total")

	code = http.StatusNotFound
	_, err = s.conflicts(t.Context())
	require.ErrorContains(t, err, "404")
}

// One catalog for every instance, or one each: distinct files.
func TestCatalogsSharedOrEach(t *testing.T) {
	h := &harness{tmp: t.TempDir(), id: 7}
	cfg := ServiceConfig{Instances: []int{1, 3}}
	dbs, err := catalogs(t.Context(), cfg, h, nil, "optimistic")
	require.NoError(t, err)
	require.Equal(t, []string{dbs[0], dbs[0], dbs[0]}, dbs)
	require.Equal(t, h.tmp, filepath.Dir(dbs[0]))
	cfg.CatalogEach = true
	dbs, err = catalogs(t.Context(), cfg, h, nil, "optimistic")
	require.NoError(t, err)
	require.Len(t, dbs, 3)
	for _, db := range dbs {
		require.Equal(t, h.tmp, filepath.Dir(db))
	}
	require.NotEqual(t, dbs[0], dbs[1])
	require.NotEqual(t, dbs[1], dbs[2])
	require.NotEqual(t, dbs[0], dbs[2])
}

// The service's live leases are read as its admin API lists them: a key
// not listed, or not in the lease store, is missing; the admin key is sent.
func TestServiceLiveLeases(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/admin/keys" || r.Header.Get("X-Admin-Key") != "admin-key" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		_, _ = io.WriteString(w, `{"keys":[
			{"id":"a","max_concurrent_uses":5,"live_leases":6,"in_store":true},
			{"id":"b","max_concurrent_uses":2,"live_leases":0,"in_store":false},
			{"id":"other","max_concurrent_uses":1,"live_leases":1,"in_store":true}]}`)
	}))
	defer srv.Close()
	s := &service{base: srv.URL, admin: "admin-key", client: srv.Client()}
	got, err := s.liveLeases(t.Context(), "a", "b", "c")
	require.NoError(t, err)
	require.Equal(t, []optimistic.KeyInfo{
		{ID: "a", Exists: true, Limit: 5, Live: 6},
		{ID: "b", Limit: 2},
		{ID: "c"},
	}, got)
	var a report.Audit
	checkLive(got, 5, "during the run", &a)
	require.Equal(t, 3, a.StateViolations, "a over its limit, b and c missing")
	require.Equal(t, "key a has 6 live leases in the store during the run, limit 5", a.First)

	s.admin = "wrong"
	_, err = s.liveLeases(t.Context(), "a")
	require.ErrorContains(t, err, "401")
}

// The sampler reads the keys batch by batch, in turn, and counts only the
// reads that answered.
func TestSamplerReadsInTurn(t *testing.T) {
	ids := []string{"a", "b", "c", "d", "e"}
	var mu sync.Mutex
	var asked [][]string
	reads := make(chan struct{}, 100)
	sm := sample(t.Context(), func(_ context.Context, keyIDs ...string) ([]optimistic.KeyInfo, error) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, keyIDs)
		reads <- struct{}{}
		out := make([]optimistic.KeyInfo, len(keyIDs))
		for i, id := range keyIDs {
			out[i] = optimistic.KeyInfo{ID: id, Exists: true, Live: 1}
		}
		return out, nil
	}, ids, 1, 2)
	for range 4 {
		<-reads
	}
	a := sm.stop()
	require.True(t, a.OK(), "%+v", a)
	require.GreaterOrEqual(t, a.Samples, 4)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, [][]string{{"a", "b"}, {"c", "d"}, {"e"}, {"a", "b"}}, asked[:4])

	failing := sample(t.Context(), func(context.Context, ...string) ([]optimistic.KeyInfo, error) {
		reads <- struct{}{}
		return nil, errors.New("down")
	}, ids, 1, 5)
	for range 3 {
		<-reads
	}
	require.Zero(t, failing.stop().Samples, "a read that failed checked nothing")
}
