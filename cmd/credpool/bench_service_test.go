package main

import (
	"context"
	"encoding/json"
	"iter"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/bench"
	"github.com/credpool/credpool/bench/report"
)

// A short service benchmark against real credpool serve processes (this
// test binary, as TestMain lets it) on SQLite and on a real redis-server:
// every run did cycles, the status counts add up, the reports are written,
// and no process or temp directory is left behind.
func TestBenchServiceShortRun(t *testing.T) {
	rep, out := runServiceBench(t, "-duration", "300ms", "-reps", "2", "-workers", "4", "-keys", "3", "-limits", "2")
	require.Len(t, rep.Cells, 2)
	require.Equal(t, []string{"sqlite", "optimistic"}, rep.Env.Strategies)
	require.NotEmpty(t, rep.Env.Redis)
	for _, c := range rep.Cells {
		require.Len(t, c.Reps, 2, c.Strategy)
		require.Equal(t, 10, c.LeaseSeconds)
		for i, r := range c.Reps {
			s := r.Service
			require.Equal(t, i == 0, r.ServiceFirst, "the order alternates")
			require.Positive(t, s.Cycles, "%s rep %d: %s", c.Strategy, i, s.FirstError)
			require.Equal(t, s.AllocateCalls, sum(maps.Values(s.AllocateStatus)), "%s rep %d: %v", c.Strategy, i, s.AllocateStatus)
			require.Equal(t, s.ReportCalls, sum(maps.Values(s.ReportStatus)), "%s rep %d: %v", c.Strategy, i, s.ReportStatus)
			require.Equal(t, s.Cycles, s.AllocateStatus["200"], "every grant became a cycle")
			require.NotNil(t, s.Conflicts, "read from the service's metrics: %s", s.FirstError)
			require.True(t, s.Audit.OK(), "%+v", s.Audit)
			require.Positive(t, s.Audit.Samples, "the lease store's state read during the run")
			require.Positive(t, r.Store.Counts.Grants)
			require.True(t, r.Store.Audit.OK(), "%+v", r.Store.Audit)
			require.Positive(t, r.Store.Audit.Samples, "the store alone's state read during the run")
			require.Equal(t, c.Strategy, r.Store.Strategy)
			require.InDelta(t, s.CyclesPerSec/r.Store.GrantsPerSec, r.ShareOfStore, 1e-12)
		}
		// Both sides warm up before the first repetition, as long as a
		// run here, audited with it: about twice its reads of the state.
		first, second := c.Reps[0], c.Reps[1]
		require.Greater(t, first.Service.Audit.Samples, second.Service.Audit.Samples, "%s: the service's warm-up", c.Strategy)
		require.Greater(t, first.Store.Audit.Samples, second.Store.Audit.Samples, "%s: the store's warm-up", c.Strategy)
		require.Positive(t, c.CyclesPerSec.Median)
		require.LessOrEqual(t, c.ShareOfStore.Min, c.ShareOfStore.Median)
	}

	raw, err := os.ReadFile(filepath.Join(out, report.JSONFile))
	require.NoError(t, err)
	var back report.ServiceReport
	require.NoError(t, json.Unmarshal(raw, &back))
	require.Equal(t, rep.Cells, back.Cells)
	md, err := os.ReadFile(filepath.Join(out, report.MarkdownFile))
	require.NoError(t, err)
	require.Contains(t, string(md), "**Oversell audit: passed.**")
	require.Contains(t, string(md), "read every 20 ms during each run")
	require.Contains(t, string(md), "| store | catalog | instances | keys | limit | workers | reps × duration | cycles/s |")
	require.Contains(t, string(md), "| sqlite | sqlite | 1 | 3 | 2 | 4 | 2 × 300ms |")
	require.Contains(t, string(md), "| dials | conflicts/cycle | store grants/s |")
}

// A short service benchmark on a PostgreSQL catalog, a throwaway server
// the harness starts and stops, with 1 and 3 instances sharing it and a
// real redis-server: one cell per instance count, every instance granted,
// no oversell, and the ratio to one instance taken within each repetition
// over the same store run.
func TestBenchServicePostgresInstances(t *testing.T) {
	rep, out := runServiceBench(t, "-catalog", "postgres", "-instances", "3,1",
		"-duration", "300ms", "-reps", "2", "-workers", "6", "-keys", "3", "-limits", "2")
	require.NotEmpty(t, rep.Postgres)
	require.Equal(t, []string{"optimistic"}, rep.Env.Strategies, "the default store on PostgreSQL")
	require.Len(t, rep.Cells, 2)
	for i, c := range rep.Cells {
		require.Equal(t, []int{1, 3}[i], c.Instances, "fewest first")
		require.Equal(t, bench.CatalogPostgres, c.Catalog)
		require.Len(t, c.Reps, 2)
		for j, r := range c.Reps {
			s, fewest := r.Service, rep.Cells[0].Reps[j]
			require.Equal(t, j == 0, r.ServiceFirst, "the order alternates")
			require.Len(t, s.InstanceCycles, c.Instances)
			for k, n := range s.InstanceCycles {
				require.Positive(t, n, "%d instances, rep %d: instance %d granted nothing: %s", c.Instances, j, k, s.FirstError)
			}
			require.Equal(t, s.Cycles, sum(slices.Values(s.InstanceCycles)))
			require.Equal(t, s.AllocateCalls, sum(maps.Values(s.AllocateStatus)), "%v", s.AllocateStatus)
			require.Equal(t, s.Cycles, s.AllocateStatus["200"], "every grant became a cycle")
			require.NotNil(t, s.Conflicts, "summed over the instances' metrics: %s", s.FirstError)
			require.True(t, s.Audit.OK(), "%+v", s.Audit)
			require.Equal(t, fewest.Store, r.Store, "the instance counts share the repetition's store run")
			require.True(t, r.Store.Audit.OK(), "%+v", r.Store.Audit)
			require.InDelta(t, s.CyclesPerSec/fewest.Service.CyclesPerSec, r.VsFewest, 1e-12)
		}
	}
	require.Equal(t, report.Spread{Median: 1, Min: 1, Max: 1}, rep.Cells[0].VsFewest)
	require.Positive(t, rep.Cells[1].VsFewest.Median)

	md, err := os.ReadFile(filepath.Join(out, report.MarkdownFile))
	require.NoError(t, err)
	require.Contains(t, string(md), "**The catalog in PostgreSQL.** PostgreSQL "+rep.Postgres)
	require.Contains(t, string(md), "**Oversell audit: passed.** In all 6 runs")
	require.Contains(t, string(md), "| service/store | vs 1 |")
}

// The control with a catalog each: two instances, each with a SQLite
// file of its own holding the keys, on one real redis-server. Both grant
// (an instance without the keys would answer 404), the limit holds
// across them, and the report says which catalogs they had.
func TestBenchServiceCatalogEach(t *testing.T) {
	rep, out := runServiceBench(t, "-catalog-each", "-instances", "1,2",
		"-duration", "500ms", "-reps", "1", "-workers", "4", "-keys", "2", "-limits", "1")
	require.Equal(t, []string{"optimistic"}, rep.Env.Strategies, "the default store with a catalog each")
	require.Len(t, rep.Cells, 2)
	require.False(t, rep.Cells[0].CatalogEach, "one instance has the one catalog")
	require.True(t, rep.Cells[1].CatalogEach)
	s := rep.Cells[1].Reps[0].Service
	require.Len(t, s.InstanceCycles, 2)
	for k, n := range s.InstanceCycles {
		require.Positive(t, n, "instance %d granted nothing: %s", k, s.FirstError)
	}
	require.Equal(t, s.Cycles, s.AllocateStatus["200"], "every grant became a cycle: %v", s.AllocateStatus)
	require.Zero(t, s.AllocateStatus["404"], "every instance has the keys")
	require.True(t, s.Audit.OK(), "%+v", s.Audit)
	md, err := os.ReadFile(filepath.Join(out, report.MarkdownFile))
	require.NoError(t, err)
	require.Contains(t, string(md), "**Instances, a catalog each.**")
	require.Contains(t, string(md), "| optimistic | sqlite, one each | 2 |")
	require.Contains(t, string(md), "| optimistic | sqlite | 1 |")
}

// runServiceBench runs "credpool bench -service" with args, this test
// binary standing in for credpool serve (TestMain lets it), and returns
// the report and the directory it was written to. It checks that the run
// left no process or temp file behind.
func runServiceBench(t *testing.T, args ...string) (*report.ServiceReport, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "service")
	tmp := t.TempDir()
	// As root, PostgreSQL runs as the postgres user, who must reach its
	// directory in here.
	for _, dir := range []string{filepath.Dir(tmp), tmp} {
		require.NoError(t, os.Chmod(dir, 0o755))
	}
	// Everything the run creates in the temp directory lands here.
	t.Setenv("TMPDIR", tmp)
	b, err := parseBench(append([]string{"-service", "-out", out}, args...))
	require.NoError(t, err)
	require.True(t, b.service)
	cfg := b.svc
	cfg.Serve, cfg.ServeEnv = []string{os.Args[0], "serve"}, []string{"CREDPOOL_TEST_MAIN=1"}
	cfg.Args = []string{"credpool", "bench", "-service", "(test)"}
	before := livingChildren(t)

	rep, err := bench.RunService(context.Background(), cfg)
	require.NoError(t, err)
	require.Equal(t, before, livingChildren(t), "a process the run started is still running")
	left, err := os.ReadDir(tmp)
	require.NoError(t, err)
	require.Empty(t, left, "the run left files in the temp directory")
	return rep, out
}

// sum adds up the counts.
func sum(counts iter.Seq[int64]) int64 {
	var n int64
	for v := range counts {
		n += v
	}
	return n
}

func TestBenchServiceFlags(t *testing.T) {
	b, err := parseBench([]string{"-service"})
	require.NoError(t, err)
	c := b.svc
	require.Equal(t, []int{64}, c.Workers)
	require.Equal(t, []int{5}, c.Limits)
	require.Equal(t, 20, c.Keys)
	require.Equal(t, 3*time.Second, c.Duration)
	require.Equal(t, 4, c.Reps, "even: each order runs first equally often in every cell")
	require.Equal(t, 10*time.Second, c.TTL)
	var names []string
	for _, s := range c.Strategies {
		names = append(names, s.Name)
	}
	require.Equal(t, []string{"sqlite", "optimistic"}, names)
	require.Equal(t, bench.CatalogSQLite, c.Catalog)
	require.Empty(t, c.Instances, "one instance: the default")
	require.Equal(t, 4*2*2, c.Runs(), "reps × stores × (one service run and one store run)")

	b, err = parseBench([]string{"-service", "-procs", "1", "-rates", "0", "-strategies", "optimistic", "-workers", "8,16", "-duration", "1s"})
	require.NoError(t, err)
	require.Equal(t, []int{8, 16}, b.svc.Workers)
	require.Equal(t, time.Second, b.svc.Duration)

	b, err = parseBench([]string{"-service", "-catalog", "postgres", "-instances", "1,3"})
	require.NoError(t, err)
	require.Equal(t, bench.CatalogPostgres, b.svc.Catalog)
	require.Equal(t, []int{1, 3}, b.svc.Instances)
	require.Len(t, b.svc.Strategies, 1)
	require.Equal(t, "optimistic", b.svc.Strategies[0].Name, "the SQLite store cannot run on PostgreSQL")
	require.Equal(t, 4*1*(2+1), b.svc.Runs())

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-service", "-procs", "2"}, "-procs must be 1"},
		{[]string{"-service", "-procs", "1,2"}, "-procs must be 1"},
		{[]string{"-service", "-rates", "1000"}, "-rates must be 0"},
		{[]string{"-service", "-scenarios", "hot"}, "-scenarios does not apply to -service"},
		{[]string{"-service", "-hold", "1ms"}, "-hold does not apply to -service"},
		{[]string{"-service", "-strategies", "lua"}, "credpool serve has no lua lease store"},
		{[]string{"-service", "-strategies", "redis"}, `unknown strategy "redis"`},
		{[]string{"-service", "-ttl", "1500ms"}, "whole seconds"},
		{[]string{"-service", "-reps", "0"}, "reps must be at least 1"},
		{[]string{"-service", "-workers", "0"}, "workers must be at least 1"},
		{[]string{"-service", "-keys", "0"}, "keys must be at least 1"},
		{[]string{"-reps", "0"}, "-reps must be at least 1"},
		{[]string{"-pause", "1ms,x"}, `-pause: "x" is not a duration`},
		{[]string{"-service", "-pause", "1ms,5ms"}, "-service takes one -pause"},
		{[]string{"-strategies", "lua,lua-gate"}, `unknown strategy "lua-gate"`},
		{[]string{"-catalog", "postgres"}, "-catalog needs -service"},
		{[]string{"-instances", "3"}, "-instances needs -service"},
		{[]string{"-catalog-each", "-instances", "3"}, "-catalog-each needs -service"},
		{[]string{"-service", "-catalog-each", "-instances", "1,2", "-strategies", "sqlite"}, "instances with a catalog each would not share their leases"},
		{[]string{"-service", "-catalog-each"}, "a catalog each needs more than one instance"},
		{[]string{"-service", "-catalog", "postgres", "-strategies", "optimistic,sqlite"}, "the sqlite lease store lives in a SQLite catalog's file"},
		{[]string{"-service", "-catalog", "mysql"}, `unknown catalog "mysql"`},
		{[]string{"-service", "-instances", "1,0"}, "instances must be at least 1"},
		{[]string{"-service", "-instances", "1,x"}, `-instances: "x" is not a whole number`},
		{[]string{"-service", "-instances", "3,1,3"}, "3 instances listed twice"},
	} {
		_, err := parseBench(tc.args)
		require.ErrorContains(t, err, tc.want, strings.Join(tc.args, " "))
	}
}

// -redis-cluster reaches the suite and the service benchmark.
func TestBenchRedisClusterFlag(t *testing.T) {
	b, err := parseBench([]string{"-redis-cluster", "-redis", "redis://127.0.0.1:7000?addr=127.0.0.1:7001"})
	require.NoError(t, err)
	require.True(t, b.suite.RedisCluster)
	require.Equal(t, "redis://127.0.0.1:7000?addr=127.0.0.1:7001", b.suite.RedisURL)
	b, err = parseBench([]string{"-service", "-redis-cluster"})
	require.NoError(t, err)
	require.True(t, b.svc.RedisCluster)
	b, err = parseBench(nil)
	require.NoError(t, err)
	require.False(t, b.suite.RedisCluster)
}
