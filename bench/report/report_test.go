package report

import (
	"bytes"
	"encoding/csv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRatio(t *testing.T) {
	for _, tc := range []struct {
		num, den float64
		want     string
	}{
		{1, 2, "0.50×"},
		{2, 1, "2.00×"},
		{1, 8, "0.12×"},
		{1, 3, "0.33×"},
		{1, 300, "0.0033×"},
		{50, 1, "50×"},
		{9.999, 1, "10.00×"},
		{0, 5, "0×"},
		{5, 0, "n/a"},
		{0, 0, "n/a"},
	} {
		require.Equal(t, tc.want, Ratio(tc.num, tc.den), "%g/%g", tc.num, tc.den)
	}
}

func TestCommandLine(t *testing.T) {
	require.Equal(t, `credpool bench -strategies optimistic,lua -out bench/results`,
		CommandLine([]string{"credpool", "bench", "-strategies", "optimistic,lua", "-out", "bench/results"}))
	require.Equal(t, `credpool bench -redis 'redis://h:6379/0?x=a b' '' 'it'\''s'`,
		CommandLine([]string{"credpool", "bench", "-redis", "redis://h:6379/0?x=a b", "", "it's"}))
}

func ptr(v float64) *float64 { return &v }

// sample is two strategies with the same admission control on one cell,
// the first oversold once.
func sample() *Report {
	cell := Run{Scenario: "hot", Loop: "closed", Keys: 1, Limit: 1, Candidates: 1, Workers: 8, Procs: 2, Pause: "1ms", Rep: 1}
	opt, lua := cell, cell
	opt.Strategy, opt.GrantsPerSec, opt.GrantLatency.P99, opt.TimeToGrant.P99 = "optimistic", 100, 8, 40
	opt.Counts.Grants = 300
	opt.ConflictsPerGrant, opt.RoundTripsPerGrant, opt.HoldExcessMicros = ptr(7.5), ptr(20), ptr(61.4)
	opt.Audit = Audit{HolderViolations: 3, MaxHolders: 2, First: "2 holders of k0, limit 1"}
	lua.Strategy, lua.GrantsPerSec, lua.GrantLatency.P99, lua.TimeToGrant.P99 = "lua+gate", 400, 2, 80
	lua.Counts.Grants = 1200
	lua.ConflictsPerGrant, lua.RoundTripsPerGrant = ptr(0), ptr(2)
	return &Report{Env: Env{Strategies: []string{"optimistic", "lua+gate"}, CommandLine: "credpool bench"}, Runs: []Run{opt, lua}}
}

func TestMarkdownSideBySide(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, sample().WriteMarkdown(&b))
	md := b.String()
	require.Contains(t, md, "**Oversell audit: FAILED.**")
	require.Contains(t, md, "- optimistic, hot closed limit 1, 8 workers, 2 procs: 3 holder violations (max 2 holders, limit 1)")
	require.Contains(t, md, "| hot | closed | 1ms | 1 | 8 | 2 | 100 | 400 | 0.25× |", "grants/s")
	require.Contains(t, md, "| hot | closed | 1ms | 1 | 8 | 2 | 40.0 | 80.0 | 0.50× |", "time to grant p99")
	require.Contains(t, md, "| hot | closed | 1ms | 1 | 8 | 2 | 8.00 | 2.00 | 4.00× |", "per-call p99")
	require.Contains(t, md, "| hot | closed | 1ms | 1 | 8 | 2 | 7.50 | 0.00 | 20.00 | 2.00 |", "conflicts and round trips")
	require.Contains(t, md, "| optimistic | 1 | hot | closed | 1ms | 1 | 8 | 2 | 100 |")
	require.Contains(t, md, "| hold +µs | max holders | audit |")
	require.Contains(t, md, "| 61 | 2 | **FAILED** (3+0) |", "the hold excess in whole µs")
	require.Contains(t, md, "| n/a | 0 | ok |", "no hold timed")
	require.Contains(t, md, "**FAILED** (3+0)")
	require.Contains(t, md, "Every cell ran once")
}

// An open loop whose store fell behind says how many of the offered calls
// it made: its latencies leave the others out.
func TestMarkdownSaysCallsNotMade(t *testing.T) {
	rep := sample()
	rep.Runs[0].Loop, rep.Runs[0].Counts.Offered, rep.Runs[0].Counts.Calls = "open", 8000, 2500
	rep.Runs[1].Loop, rep.Runs[1].Counts.Offered, rep.Runs[1].Counts.Calls = "open", 8000, 8000
	var b bytes.Buffer
	require.NoError(t, rep.WriteMarkdown(&b))
	md := b.String()
	require.Contains(t, md, "- optimistic, hot open 0/s limit 1, 8 workers, 2 procs: made 2500 of the 8000 calls offered")
	require.NotContains(t, md, "lua+gate, hot open 0/s limit 1, 8 workers, 2 procs: made")
}

// Repetitions of a cell make one row: the median with the range, ratios
// of medians, and only between strategies with the same admission
// control.
func TestMarkdownMediansOfRepetitions(t *testing.T) {
	var runs []Run
	for i, g := range [][2]float64{{100, 300}, {130, 200}, {90, 250}} {
		for j, name := range []string{"optimistic-nogate", "lua", "optimistic"} {
			runs = append(runs, Run{Strategy: name, Rep: i + 1, Scenario: "hot", Loop: "closed", Limit: 1, Workers: 64, Procs: 1,
				Pause: "5ms", GrantsPerSec: g[j%2] * float64(j+1)})
		}
	}
	rep := &Report{Env: Env{Strategies: []string{"optimistic-nogate", "lua", "optimistic"}}, Runs: runs}
	var b bytes.Buffer
	require.NoError(t, rep.WriteMarkdown(&b))
	md := b.String()
	require.Contains(t, md, "Every cell ran 3 times")
	require.Contains(t, md, "| scenario | loop | pause | limit | workers | procs | optimistic-nogate | lua | optimistic | optimistic-nogate/lua |\n",
		"no lua+gate: optimistic has no ratio, lua is no like for it")
	require.Contains(t, md, "| hot | closed | 5ms | 1 | 64 | 1 | 100 (90–130) | 500 (400–600) | 300 (270–390) | 0.20× |")
}

// A run without a grant has no per-grant figure: the cell's median of
// the others says it is of some runs only, and so does a ratio of it.
func TestMarkdownSaysAFigureIsOfSomeRuns(t *testing.T) {
	var runs []Run
	for i, g := range []float64{1000, 1100, 0} {
		for _, name := range []string{"optimistic", "lua+gate"} {
			run := Run{Strategy: name, Rep: i + 1, Scenario: "hot", Loop: "closed", Limit: 1, Workers: 64, Procs: 1, Pause: "1ms", GrantsPerSec: 1000}
			if name == "lua+gate" {
				run.GrantsPerSec = g
			}
			if run.GrantsPerSec > 0 {
				trips := 60 + 10*float64(i)
				run.RoundTripsPerGrant = &trips
				run.Counts.Grants = int64(run.GrantsPerSec)
				run.GrantLatency.P99 = 2
			}
			runs = append(runs, run)
		}
	}
	rep := &Report{Env: Env{Strategies: []string{"optimistic", "lua+gate"}}, Runs: runs}
	var b bytes.Buffer
	require.NoError(t, rep.WriteMarkdown(&b))
	md := b.String()
	require.Contains(t, md, "| 1000 (1000–1000) | 1000 (0–1100) | 1.00× |", "grants/s counts every run")
	require.Contains(t, md, "| 2.00 (2.00–2.00) | 2.00 (2.00–2.00) (2 of 3 runs) | 1.00× (not of every run) |")
	require.Contains(t, md, "| 0.00 / 2.00 / 0.00 | 0.00 / 2.00 / 0.00 (2 of 3 runs) |", "the medians' table too")
	require.Contains(t, md, "| 70.00 (60.00–80.00) | 65.00 (60.00–70.00) (2 of 3 runs) |")
}

func TestCSVHasOneLinePerRun(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, sample().WriteCSV(&b))
	lines, err := csv.NewReader(strings.NewReader(b.String())).ReadAll()
	require.NoError(t, err)
	require.Len(t, lines, 3)
	require.Equal(t, csvHeader, lines[0])
	for _, l := range lines[1:] {
		require.Len(t, l, len(csvHeader))
	}
	col := func(name string) int {
		for i, h := range csvHeader {
			if h == name {
				return i
			}
		}
		t.Fatalf("no column %s", name)
		return -1
	}
	require.Equal(t, "lua+gate", lines[2][col("strategy")])
	require.Equal(t, "80", lines[2][col("ttg_p99_ms")])
	require.Equal(t, "1ms", lines[2][col("pause")])
	require.Equal(t, "1", lines[2][col("rep")])
	require.Equal(t, "", lines[2][col("commands_per_grant")], "n/a is empty")
	require.Equal(t, "3", lines[1][col("holder_violations")])
	require.Equal(t, "61.4", lines[1][col("hold_excess_us")])
	require.Equal(t, "", lines[2][col("hold_excess_us")], "no hold timed")
	require.Equal(t, "", lines[1][col("wait")], "retrying callers")
	require.Equal(t, "", lines[1][col("max_over_min_grants")], "no callers counted")
}

func TestFairnessOf(t *testing.T) {
	for _, tc := range []struct {
		name   string
		grants []int64
		want   Fairness
	}{
		{"none", nil, Fairness{}},
		{"even", []int64{4, 4}, Fairness{Callers: 2, Min: 4, Max: 4, MaxOverMin: ptr(1)}},
		{"spread", []int64{2, 6, 3}, Fairness{Callers: 3, Min: 2, Max: 6, MaxOverMin: ptr(3)}},
		{"starved", []int64{0, 5, 0}, Fairness{Callers: 3, Max: 5, Starved: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, FairnessOf(tc.grants))
		})
	}
	require.Equal(t, "∞ (2 starved)", FormatMaxOverMin(FairnessOf([]int64{0, 5, 0})))
	require.Equal(t, "3.00", FormatMaxOverMin(FairnessOf([]int64{2, 6, 3})))
	require.Equal(t, "n/a", FormatMaxOverMin(FairnessOf(nil)))
}

// Waiting callers get their own rows, and a table beside the retrying
// callers of the same workload, one row per pause; a strategy that could
// not wait is named.
func TestMarkdownRetryVsWait(t *testing.T) {
	cell := Run{Scenario: "hot", Loop: "closed", Keys: 1, Limit: 1, Candidates: 1, Workers: 64, Procs: 1, Rep: 1, Strategy: "optimistic",
		Counts: Counts{Grants: 100}}
	retry1, retry5, wait := cell, cell, cell
	retry1.Pause, retry1.GrantsPerSec, retry1.TimeToGrant.P99 = "1ms", 500, 600
	retry1.RequestsPerGrant, retry1.Fairness = ptr(36), FairnessOf([]int64{3, 9})
	retry5.Pause, retry5.GrantsPerSec, retry5.TimeToGrant.P99 = "5ms", 400, 900
	retry5.RequestsPerGrant, retry5.Fairness = ptr(12), FairnessOf([]int64{0, 9})
	wait.Pause, wait.Wait, wait.GrantsPerSec, wait.TimeToGrant.P99 = "0s", "10s", 520, 150
	wait.RoundTripsPerGrant, wait.RequestsPerGrant, wait.Fairness = ptr(3), ptr(3.1), FairnessOf([]int64{8, 9})
	rep := &Report{Env: Env{Strategies: []string{"optimistic", "lua"}}, Runs: []Run{retry1, retry5, wait}}
	rep.Skip("lua", "waiting callers: the store cannot wait for a slot")
	rep.Skip("lua", "waiting callers: the store cannot wait for a slot")
	var b bytes.Buffer
	require.NoError(t, rep.WriteMarkdown(&b))
	md := b.String()
	require.Contains(t, md, "**Skipped:** lua in 2 runs (waiting callers: the store cannot wait for a slot).")
	require.Contains(t, md, "| hot | closed, wait 10s | – | 1 | 64 | 1 | 520 | – |", "a row of its own")
	require.Contains(t, md, "## Retrying vs waiting callers")
	require.Contains(t, md, "| optimistic | hot | 1 | 64 | 1 | 1ms | 10s | 600 / 150 | 4.00× | 500 / 520 | 1.04× | 36.00 / 3.10 | 3.00 / 1.12 |")
	require.Contains(t, md, "| optimistic | hot | 1 | 64 | 1 | 5ms | 10s | 900 / 150 | 6.00× | 400 / 520 | 1.30× | 12.00 / 3.10 | ∞ / 1.12 |")
	require.Contains(t, md, "| 3.00 | 3.10 | n/a |", "round trips, then requests per grant in every metric")
	require.Contains(t, md, "| ∞ (1 starved) |")
	require.NotContains(t, md, "| lua | hot |", "no row for a strategy that did not wait")
}
