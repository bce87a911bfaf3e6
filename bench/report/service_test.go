package report

import (
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
		}
	}
	c := ServiceCell{Reps: []ServiceRep{rep(100, 1000), rep(300, 1000), rep(200, 4000)}}
	c.Summarize()
	require.Equal(t, Spread{Median: 200, Min: 100, Max: 300}, c.CyclesPerSec)
	require.Equal(t, Spread{Median: 20, Min: 10, Max: 30}, c.AllocateP99)
	require.Equal(t, Spread{Median: 1000, Min: 1000, Max: 4000}, c.StoreGrantsPerSec)
	require.Equal(t, Spread{Median: 0.1, Min: 0.05, Max: 0.3}, c.ShareOfStore, "the share is taken within each repetition")
}

func TestStatuses(t *testing.T) {
	require.Equal(t, "–", statuses(nil))
	require.Equal(t, "200: 7, 429: 2, no_response: 1", statuses(map[string]int64{"no_response": 1, "429": 2, "200": 7}))
}
