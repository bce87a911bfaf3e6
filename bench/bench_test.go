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
var testStrategies = append(append([]bench.Strategy(nil), bench.Strategies()...), unsafeStrategy)

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
	g.HoldDist, g.Pause = "fixed", 100*time.Microsecond
	optimistic, err := bench.Select(bench.Strategies(), "optimistic")
	require.NoError(t, err)
	cfg := config(append([]bench.Strategy{unsafeStrategy}, optimistic...), cells(t, g))
	var out bytes.Buffer
	cfg.Stdout = &out
	rep, err := bench.Run(context.Background(), cfg)
	require.ErrorIs(t, err, bench.ErrOversold)
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
	require.Contains(t, out.String(), "**Oversell audit: FAILED.**")
}

// A short run of all three stores, in one and two processes and in an open
// loop, writes every output, and each parses.
func TestShortRunWritesEveryOutput(t *testing.T) {
	open := grid([]string{"uniform"}, 4, 2, 1)
	open.Rates = []float64{200}
	all := cells(t, grid([]string{"hot", "zipf"}, 4, 2, 1, 2), open)
	dir := t.TempDir()
	cfg := config(bench.Strategies(), all)
	var out bytes.Buffer
	cfg.Stdout, cfg.OutDir = &out, dir
	rep, err := bench.Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Len(t, rep.Runs, len(all)*3)

	md := out.String()
	require.Contains(t, md, "**Oversell audit: passed.**")
	require.Contains(t, md, "| grants/s optimistic | grants/s lua | grants/s sqlite | optimistic/lua |")
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
	require.Equal(t, []string{"optimistic", "lua", "sqlite"}, env.Strategies)
	for _, run := range back.Runs {
		require.Positive(t, run.Counts.Grants, "%s %s", run.Strategy, run.Scenario)
		require.True(t, run.Audit.OK())
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
	// hot, zipf and open-loop uniform, each goodput, conflicts and p99.
	require.Len(t, plots, 9)
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
