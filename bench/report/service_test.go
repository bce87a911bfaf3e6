package report

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSpreadOf(t *testing.T) {
	for _, tc := range []struct {
		vs   []float64
		want Spread
	}{
		{nil, Spread{}},
		{[]float64{4}, Spread{Median: 4, Min: 4, Max: 4}},
		{[]float64{3, 1, 2}, Spread{Median: 2, Min: 1, Max: 3}},
		{[]float64{4, 1, 3, 2}, Spread{Median: 2.5, Min: 1, Max: 4}},
	} {
		require.Equal(t, tc.want, SpreadOf(tc.vs), "%v", tc.vs)
	}
}

func TestServiceCellSummarize(t *testing.T) {
	rep := func(cycles, grants float64) ServiceRep {
		return ServiceRep{
			Service:      ServiceRun{CyclesPerSec: cycles, AllocateLatency: Latency{P99: cycles / 10}},
			Store:        Run{GrantsPerSec: grants},
			ShareOfStore: cycles / grants,
			VsFewest:     cycles / 200,
		}
	}
	c := ServiceCell{Reps: []ServiceRep{rep(100, 1000), rep(300, 1000), rep(200, 4000)}}
	c.Summarize()
	require.Equal(t, Spread{Median: 200, Min: 100, Max: 300}, c.CyclesPerSec)
	require.Equal(t, Spread{Median: 20, Min: 10, Max: 30}, c.AllocateP99)
	require.Equal(t, Spread{Median: 1000, Min: 1000, Max: 4000}, c.StoreGrantsPerSec)
	require.Equal(t, Spread{Median: 0.1, Min: 0.05, Max: 0.3}, c.ShareOfStore, "the share is taken within each repetition")
	require.Equal(t, Spread{Median: 1, Min: 0.5, Max: 1.5}, c.VsFewest)
}

// With several instance counts the summary says how they shared the
// PostgreSQL catalog, adds the ratio column, and counts a repetition's
// store run once although every instance count's cell carries it.
func TestServiceMarkdownInstances(t *testing.T) {
	cell := func(instances int, cycles float64) ServiceCell {
		c := ServiceCell{Strategy: "optimistic", Catalog: "postgres", Instances: instances, Keys: 20, Limit: 5, Workers: 64, Duration: "3s"}
		for range 3 {
			c.Reps = append(c.Reps, ServiceRep{
				Service: ServiceRun{CyclesPerSec: cycles}, Store: Run{GrantsPerSec: 4000},
				ShareOfStore: cycles / 4000, VsFewest: cycles / 1000,
			})
		}
		c.Summarize()
		return c
	}
	r := &ServiceReport{Postgres: "15.14", Cells: []ServiceCell{cell(1, 1000), cell(3, 950)}}
	var b strings.Builder
	require.NoError(t, r.WriteMarkdown(&b))
	md := b.String()
	require.Contains(t, md, "**The catalog in PostgreSQL.** PostgreSQL 15.14 on loopback")
	require.Contains(t, md, "All 3 instances run throughout")
	require.Contains(t, md, "In all 9 runs")
	require.Contains(t, md, "| store | catalog | instances | keys |")
	require.Contains(t, md, "| store p99 | service/store | vs 1 |")
	require.Contains(t, md, "| 23.8% (23.8%–23.8%) | 0.95× (0.95×–0.95×) |")

	one := &ServiceReport{Cells: []ServiceCell{cell(1, 1000)}}
	b.Reset()
	require.NoError(t, one.WriteMarkdown(&b))
	require.NotContains(t, b.String(), "vs 1")
	require.NotContains(t, b.String(), "PostgreSQL 15")
	require.Contains(t, b.String(), "In all 6 runs")
}

func TestStatuses(t *testing.T) {
	require.Equal(t, "–", statuses(nil))
	require.Equal(t, "200: 7, 429: 2, no_response: 1", statuses(map[string]int64{"no_response": 1, "429": 2, "200": 7}))
}
