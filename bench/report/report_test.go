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

// sample is two strategies on one cell, the first oversold.
func sample() *Report {
	cell := Run{Scenario: "hot", Loop: "closed", Keys: 1, Limit: 1, Candidates: 1, Workers: 8, Procs: 2}
	opt, lua := cell, cell
	opt.Strategy, opt.GrantsPerSec, opt.GrantLatency.P99 = "optimistic", 100, 8
	opt.ConflictsPerGrant, opt.RoundTripsPerGrant = ptr(7.5), ptr(20)
	opt.Audit = Audit{HolderViolations: 3, MaxHolders: 2, First: "2 holders of k0, limit 1"}
	lua.Strategy, lua.GrantsPerSec, lua.GrantLatency.P99 = "lua", 400, 2
	lua.ConflictsPerGrant, lua.RoundTripsPerGrant = ptr(0), ptr(2)
	return &Report{Env: Env{Strategies: []string{"optimistic", "lua"}, CommandLine: "credpool bench"}, Runs: []Run{opt, lua}}
}

func TestMarkdownSideBySide(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, sample().WriteMarkdown(&b))
	md := b.String()
	require.Contains(t, md, "**Oversell audit: FAILED.**")
	require.Contains(t, md, "- optimistic, hot closed limit 1, 8 workers, 2 procs: 3 holder violations (max 2 holders, limit 1)")
	require.Contains(t, md, "| hot | closed | 1 | 8 | 2 | 100 | 400 | 0.25× | 8.00 | 2.00 | 4.00× | 7.50 | 0.00 | 20.00 | 2.00 |")
	require.Contains(t, md, "| optimistic | hot | closed | 1 | 8 | 2 | 100 |")
	require.Contains(t, md, "**FAILED** (3+0)")
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
	require.Equal(t, "lua", lines[2][col("strategy")])
	require.Equal(t, "", lines[2][col("commands_per_grant")], "n/a is empty")
	require.Equal(t, "3", lines[1][col("holder_violations")])
}
