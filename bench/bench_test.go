package bench_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/bench"
	"github.com/credpool/credpool/bench/report"
)

// workerEnv makes the test binary a harness worker process (see TestMain).
const workerEnv = "CREDPOOL_BENCH_TEST_WORKER=1"

// testStrategies are what the workers of these tests know.
var testStrategies = append(append([]bench.Strategy(nil), bench.Strategies()...), unsafeStrategy, forgetfulStrategy)

// TestMain doubles as the worker process of multi-process cells: the
// harness re-executes this test binary with workerEnv set, as credpool
// re-executes itself with "bench -worker".
func TestMain(m *testing.M) {
	if os.Getenv("CREDPOOL_BENCH_TEST_WORKER") == "1" {
		if err := bench.Worker(context.Background(), os.Stdin, os.Stdout, testStrategies); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// config is a harness run whose workers are this test binary.
func config(strategies []bench.Strategy, cells []bench.Cell) bench.Config {
	return bench.Config{
		Strategies: strategies, Cells: cells, Seed: 1,
		Worker: []string{os.Args[0]}, WorkerEnv: []string{workerEnv},
		Args: []string{"credpool", "bench", "(test)"},
	}
}

// grid is a tiny grid: one worker count, short runs, few keys.
func grid(scenarios []string, workers, limit int, procs ...int) bench.Grid {
	g := bench.Standard()
	g.Scenarios, g.Workers, g.Limits, g.Procs = scenarios, []int{workers}, []int{limit}, procs
	g.Pauses = []time.Duration{time.Millisecond}
	g.Keys, g.Duration = 20, 200*time.Millisecond
	return g
}

func cells(t *testing.T, grids ...bench.Grid) []bench.Cell {
	t.Helper()
	var all []bench.Cell
	for _, g := range grids {
		c, err := g.Cells()
		require.NoError(t, err)
		all = append(all, c...)
	}
	return all
}

// The check-then-act store oversells a limit-1 key within moments, in one
// process and across two. Only the harness's holder count sees it: after
// everyone released, the store's own state is back to zero holders. The
// correct store on the same cells passes.
func TestAuditCatchesUnsafeStore(t *testing.T) {
	g := grid([]string{"hot"}, 8, 1, 1, 2)
	g.HoldDist, g.Pauses = "fixed", []time.Duration{100 * time.Microsecond}
	rep := runOversold(t, unsafeStrategy, g)
	require.Len(t, rep.Runs, 4)
	for _, run := range rep.Runs {
		if run.Strategy != "unsafe" {
			require.True(t, run.Audit.OK(), "%s, %d procs: %+v", run.Strategy, run.Procs, run.Audit)
			continue
		}
		require.Positive(t, run.Counts.Grants)
		require.Positive(t, run.Audit.HolderViolations, "%d procs: the holder count must catch it", run.Procs)
		require.Greater(t, run.Audit.MaxHolders, int64(1))
		require.Contains(t, run.Audit.First, "holders of k0, limit 1")
		require.Zero(t, run.Audit.StateViolations, "the end state alone would not have shown it")
	}
}

// runOversold runs unsafe and the correct store on g's cells, and checks
// that the run failed its audit, in the error and in the report.
func runOversold(t *testing.T, unsafe bench.Strategy, g bench.Grid) *report.Report {
	t.Helper()
	optimistic, err := bench.Select(bench.Strategies(), "optimistic")
	require.NoError(t, err)
	cfg := config(append([]bench.Strategy{unsafe}, optimistic...), cells(t, g))
	var out bytes.Buffer
	cfg.Stdout = &out
	rep, err := bench.Run(context.Background(), cfg)
	require.ErrorIs(t, err, bench.ErrOversold)
	require.Contains(t, out.String(), "**Oversell audit: FAILED.**")
	return rep
}

// Callers that hold for zero give a lease up microseconds after the
// harness counts its holder, so the count rarely sees two overlap: the
// audit reads the store's state during such a run too, and that is where
// the check-then-act store's oversell shows. The correct store passes.
func TestAuditReadsTheStoreDuringZeroHolds(t *testing.T) {
	g := grid([]string{"hot"}, 8, 1, 1)
	g.Hold, g.HoldDist, g.Duration = 0, "fixed", 500*time.Millisecond
	rep := runOversold(t, unsafeStrategy, g)
	require.Len(t, rep.Runs, 2)
	for _, run := range rep.Runs {
		require.Positive(t, run.Audit.Samples, "%s: read during the run", run.Strategy)
		if run.Strategy != "unsafe" {
			require.True(t, run.Audit.OK(), "%s: %+v", run.Strategy, run.Audit)
			continue
		}
		require.Positive(t, run.Audit.StateViolations, "the store's state during the run must show it")
	}
}

// A crashed holder's lease keeps its slot until it expires, and the audit
// counts the holder until then: a store that hands the slot on sooner is
// caught, in one process and in two, although every caller that released
// did so in time. The correct store on the same cells passes, its crashed
// leases expiring during the run.
func TestAuditCountsCrashedHolders(t *testing.T) {
	g := grid([]string{"hot"}, 8, 1, 1, 2)
	g.HoldDist, g.Duration, g.TTL, g.CrashShare = "fixed", 500*time.Millisecond, 300*time.Millisecond, 0.3
	rep := runOversold(t, forgetfulStrategy, g)
	require.Len(t, rep.Runs, 4)
	for _, run := range rep.Runs {
		require.Positive(t, run.Counts.Crashed, "%s, %d procs", run.Strategy, run.Procs)
		if run.Strategy != "forgetful" {
			require.True(t, run.Audit.OK(), "%d procs: %+v", run.Procs, run.Audit)
			continue
		}
		require.Positive(t, run.Audit.HolderViolations, "%d procs: the holder count must catch it", run.Procs)
		require.Contains(t, run.Audit.First, "holders of")
	}
}

// A short run of every store, twice, in one and two processes and in an
// open loop, writes every output, and each parses.
func TestShortRunWritesEveryOutput(t *testing.T) {
	open := grid([]string{"uniform"}, 4, 2, 1)
	open.Rates = []float64{200}
	all := cells(t, grid([]string{"hot", "zipf"}, 4, 2, 1, 2), open)
	dir := t.TempDir()
	cfg := config(bench.Strategies(), all)
	cfg.Reps = 2
	var out bytes.Buffer
	cfg.Stdout, cfg.OutDir = &out, dir
	rep, err := bench.Run(context.Background(), cfg)
	require.NoError(t, err)
	names := []string{"optimistic", "optimistic-nogate", "lua", "lua+gate", "sqlite"}
	require.Len(t, rep.Runs, len(all)*len(names)*2)
	for i, name := range names {
		first, second := rep.Runs[i], rep.Runs[len(names)+i]
		require.Equal(t, name, first.Strategy, "the given order first")
		require.Equal(t, 1, first.Rep)
		require.Equal(t, names[len(names)-1-i], second.Strategy, "then the reverse")
		require.Equal(t, 2, second.Rep)
		next := rep.Runs[2*len(names)+i]
		require.Equal(t, names[len(names)-1-i], next.Strategy, "the next cell starts with the reverse")
		require.Equal(t, 1, next.Rep)
	}

	md := out.String()
	require.Contains(t, md, "**Oversell audit: passed.**")
	require.Contains(t, md, "| scenario | loop | pause | limit | workers | procs | optimistic | optimistic-nogate | lua | lua+gate | sqlite | "+
		"optimistic/lua+gate | optimistic-nogate/lua |", "like with like: gate against gate, none against none")
	require.Contains(t, md, "### Time to grant, p99 (ms)")
	require.Contains(t, md, "| hot | closed | 1ms | 2 | 4 | 1 |")
	file, err := os.ReadFile(filepath.Join(dir, report.MarkdownFile))
	require.NoError(t, err)
	require.Equal(t, md, string(file))

	raw, err := os.ReadFile(filepath.Join(dir, report.JSONFile))
	require.NoError(t, err)
	var back report.Report
	require.NoError(t, json.Unmarshal(raw, &back))
	require.Equal(t, rep.Runs, back.Runs)
	env := back.Env
	require.Equal(t, "credpool bench '(test)'", env.CommandLine)
	require.NotEmpty(t, env.Redis)
	require.Regexp(t, `^v9\.`, env.GoRedis)
	require.Positive(t, env.GOMAXPROCS)
	require.Positive(t, env.NumCPU)
	require.Equal(t, names, env.Strategies)
	for _, run := range back.Runs {
		require.Positive(t, run.Counts.Grants, "%s %s", run.Strategy, run.Scenario)
		require.True(t, run.Audit.OK())
		require.GreaterOrEqual(t, run.TimeToGrant.Max, run.GrantLatency.Max, "a grant waits at least its own call")
		require.Equal(t, run.Strategy != "sqlite", run.CommandsPerGrant != nil, "commands are counted on Redis only")
		require.Equal(t, run.Strategy != "sqlite", run.RoundTripsPerGrant != nil)
		if run.Loop == "open" {
			require.Equal(t, int64(40), run.Counts.Offered, "200/s for 200ms")
		}
	}

	f, err := os.Open(filepath.Join(dir, report.CSVFile))
	require.NoError(t, err)
	defer f.Close()
	lines, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	require.Len(t, lines, len(rep.Runs)+1)

	plots, err := filepath.Glob(filepath.Join(dir, report.PlotDir, "*.png"))
	require.NoError(t, err)
	// hot, zipf and open-loop uniform, each goodput, conflicts, p99 and
	// time to grant p99.
	require.Len(t, plots, 12)
	for _, p := range plots {
		f, err := os.Open(p)
		require.NoError(t, err)
		img, err := png.Decode(f)
		require.NoError(t, f.Close())
		require.NoError(t, err, p)
		require.Greater(t, img.Bounds().Dx(), 100)
	}
}

func TestRunRefusesWhatItCannotDo(t *testing.T) {
	ctx := context.Background()
	all := cells(t, grid([]string{"hot"}, 2, 1, 2))
	_, err := bench.Run(ctx, bench.Config{Strategies: bench.Strategies(), Cells: all})
	require.ErrorContains(t, err, "worker command")
	_, err = bench.Run(ctx, bench.Config{Strategies: bench.Strategies()})
	require.Error(t, err)
	cfg := config(bench.Strategies(), all)
	cfg.RedisURL = "redis://10.1.2.3:6379"
	_, err = bench.Run(ctx, cfg)
	require.ErrorContains(t, err, "not on loopback")
}

// Waiting callers on a real redis-server, in one process and in two: no
// oversell, every caller served, the pub/sub subscriptions counted among
// the requests; the Lua store, which cannot wait, is skipped and named.
// SQLite waits too, in one process: across processes its waiters see a
// release only when they poll (optimistic.WaitPoll), too seldom for a
// short run.
func TestWaitingCallers(t *testing.T) {
	g := grid([]string{"hot"}, 8, 1, 1, 2)
	g.Keys, g.Duration, g.Waits = 1, 500*time.Millisecond, []time.Duration{10 * time.Second}
	strategies, err := bench.Select(bench.Strategies(), "optimistic,lua")
	require.NoError(t, err)
	cfg := config(strategies, cells(t, g))
	var out bytes.Buffer
	cfg.Stdout = &out
	start := time.Now()
	rep, err := bench.Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Less(t, time.Since(start), time.Minute, "a 10s wait does not outlive a 500ms run")
	require.Equal(t, []report.Skip{{Strategy: "lua", Reason: "waiting callers: the store cannot wait for a slot", Runs: 2}}, rep.Skipped)
	require.Contains(t, out.String(), "**Skipped:** lua in 2 runs")
	require.Contains(t, out.String(), "## Retrying vs waiting callers")

	g.Procs = []int{1}
	cfg.Strategies, err = bench.Select(bench.Strategies(), "sqlite")
	require.NoError(t, err)
	cfg.Cells, cfg.Stdout = cells(t, g), nil
	sqlite, err := bench.Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Empty(t, sqlite.Skipped)

	runs := append(rep.Runs, sqlite.Runs...)
	require.Len(t, runs, 3, "optimistic in one and two processes, sqlite in one")
	for _, run := range runs {
		require.True(t, run.Audit.OK(), "%s, %d procs: %+v", run.Strategy, run.Procs, run.Audit)
		require.Equal(t, "10s", run.Wait)
		require.Equal(t, 8, run.Fairness.Callers, "%s, %d procs: every process's callers", run.Strategy, run.Procs)
		require.Zero(t, run.Counts.Errors, run.FirstError)
		require.NotNil(t, run.HoldExcessMicros, "%s, %d procs: every process's holds are timed", run.Strategy, run.Procs)
		require.Zero(t, run.Counts.ShortHolds, "%s, %d procs: no hold ends early", run.Strategy, run.Procs)
		if run.Strategy == "sqlite" {
			// Its grants cost fsyncs, so how many fit in 500 ms depends on
			// the disk; that they go round the line in order does not.
			require.Positive(t, run.Fairness.Max)
			require.LessOrEqual(t, run.Fairness.Max-run.Fairness.Min, int64(3), "sqlite: %+v: callers are served in turn", run.Fairness)
			require.Nil(t, run.RequestsPerGrant)
			continue
		}
		require.Zero(t, run.Fairness.Starved, "%s, %d procs: every caller got grants", run.Strategy, run.Procs)
		require.NotNil(t, run.Fairness.MaxOverMin)
		require.Positive(t, run.Commands["ssubscribe"], "%d procs: the waiters listen for releases", run.Procs)
		require.Positive(t, run.Commands["spublish"], "releases notify")
		require.Greater(t, *run.RequestsPerGrant, *run.RoundTripsPerGrant, "the subscriptions count")
	}
}
