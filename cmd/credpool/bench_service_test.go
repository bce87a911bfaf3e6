package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
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
	out := filepath.Join(t.TempDir(), "service")
	tmp := t.TempDir()
	// Everything the run creates in the temp directory lands here.
	t.Setenv("TMPDIR", tmp)
	b, err := parseBench([]string{"-service", "-duration", "300ms", "-reps", "2", "-workers", "4", "-keys", "3", "-limits", "2", "-out", out})
	require.NoError(t, err)
	require.True(t, b.service)
	cfg := b.svc
	cfg.Serve, cfg.ServeEnv = []string{os.Args[0], "serve"}, []string{"CREDPOOL_TEST_MAIN=1"}
	cfg.Args = []string{"credpool", "bench", "-service", "(test)"}
	before := livingChildren(t)

	rep, err := bench.RunService(context.Background(), cfg)
	require.NoError(t, err)
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
			require.Equal(t, s.AllocateCalls, sum(s.AllocateStatus), "%s rep %d: %v", c.Strategy, i, s.AllocateStatus)
			require.Equal(t, s.ReportCalls, sum(s.ReportStatus), "%s rep %d: %v", c.Strategy, i, s.ReportStatus)
			require.Equal(t, s.Cycles, s.AllocateStatus["200"], "every grant became a cycle")
			require.True(t, s.Audit.OK(), "%+v", s.Audit)
			require.Positive(t, r.Store.Counts.Grants)
			require.True(t, r.Store.Audit.OK(), "%+v", r.Store.Audit)
			require.Equal(t, c.Strategy, r.Store.Strategy)
			require.InDelta(t, s.CyclesPerSec/r.Store.GrantsPerSec, r.ShareOfStore, 1e-12)
		}
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
	require.Contains(t, string(md), "| store | keys | limit | workers | reps × duration | cycles/s |")

	require.Equal(t, before, livingChildren(t), "a process the run started is still running")
	left, err := os.ReadDir(tmp)
	require.NoError(t, err)
	require.Empty(t, left, "the run left files in the temp directory")
}

func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
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
	require.Equal(t, 3, c.Reps)
	require.Equal(t, 10*time.Second, c.TTL)
	var names []string
	for _, s := range c.Strategies {
		names = append(names, s.Name)
	}
	require.Equal(t, []string{"sqlite", "optimistic"}, names)

	b, err = parseBench([]string{"-service", "-procs", "1", "-rates", "0", "-strategies", "optimistic", "-workers", "8,16", "-duration", "1s"})
	require.NoError(t, err)
	require.Equal(t, []int{8, 16}, b.svc.Workers)
	require.Equal(t, time.Second, b.svc.Duration)

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
		{[]string{"-reps", "2"}, "-reps needs -service"},
	} {
		_, err := parseBench(tc.args)
		require.ErrorContains(t, err, tc.want, strings.Join(tc.args, " "))
	}
}
