package workload

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHistogramPercentiles(t *testing.T) {
	for _, tc := range []struct {
		name string
		us   []int64 // latencies recorded, in µs
		want Percentiles
	}{
		{"empty", nil, Percentiles{}},
		{"one value", []int64{250}, Percentiles{P50: 250 * time.Microsecond, P90: 250 * time.Microsecond,
			P99: 250 * time.Microsecond, P999: 250 * time.Microsecond, Max: 250 * time.Microsecond}},
		// 1..1000µs: the p-th percentile is p*10µs; three significant
		// digits keep every value below 2048µs exact.
		{"uniform 1..1000", seq(1, 1000), Percentiles{P50: 500 * time.Microsecond, P90: 900 * time.Microsecond,
			P99: 990 * time.Microsecond, P999: 999 * time.Microsecond, Max: 1000 * time.Microsecond}},
		// 990 fast calls and 10 slow ones: p99 is still fast, p99.9 is not.
		{"tail", append(repeat(100, 990), repeat(50_000, 10)...), Percentiles{P50: 100 * time.Microsecond,
			P90: 100 * time.Microsecond, P99: 100 * time.Microsecond, P999: 50_015 * time.Microsecond,
			Max: 50_015 * time.Microsecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHistogram()
			for _, us := range tc.us {
				h.Record(time.Duration(us) * time.Microsecond)
			}
			require.Equal(t, int64(len(tc.us)), h.h.TotalCount())
			require.Equal(t, tc.want, h.Summary())
		})
	}
}

func TestHistogramClampsAndMerges(t *testing.T) {
	h := NewHistogram()
	h.Record(0)         // below 1µs counts as 1µs
	h.Record(time.Hour) // beyond the range counts as its top
	require.Equal(t, time.Microsecond, h.Percentile(50))
	require.InEpsilon(t, float64(time.Minute), float64(h.Max()), 0.001)

	other := NewHistogram()
	other.Record(time.Millisecond)
	h.Merge(other)
	require.Equal(t, int64(3), h.h.TotalCount())
	require.Equal(t, time.Millisecond, h.Percentile(50))
}

// Worker processes send their histograms to the parent as JSON.
func TestHistogramJSONRoundTrip(t *testing.T) {
	h := NewHistogram()
	for _, us := range seq(1, 5000) {
		h.Record(time.Duration(us*7) * time.Microsecond)
	}
	b, err := json.Marshal(h)
	require.NoError(t, err)
	var back Histogram
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, h.h.TotalCount(), back.h.TotalCount())
	require.Equal(t, h.Summary(), back.Summary())
	require.Error(t, json.Unmarshal([]byte(`"not a histogram"`), &back))
}

func seq(from, to int64) []int64 {
	var s []int64
	for v := from; v <= to; v++ {
		s = append(s, v)
	}
	return s
}

func repeat(v int64, n int) []int64 {
	s := make([]int64, n)
	for i := range s {
		s[i] = v
	}
	return s
}
