package workload

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// highest is the largest latency a Histogram tells apart; longer ones
// count as this.
const highest = time.Minute

// Histogram records latencies from 1µs to a minute with three significant
// digits (an HDR histogram). It is not safe for concurrent use.
type Histogram struct{ h *hdrhistogram.Histogram }

// NewHistogram returns an empty Histogram.
func NewHistogram() *Histogram {
	return &Histogram{h: hdrhistogram.New(1, highest.Microseconds(), 3)}
}

// Record adds one latency.
func (h *Histogram) Record(d time.Duration) {
	us := min(max(d.Microseconds(), 1), highest.Microseconds())
	// In range by construction, so RecordValue cannot fail.
	_ = h.h.RecordValue(us)
}

// Merge adds every latency recorded in o.
func (h *Histogram) Merge(o *Histogram) { h.h.Merge(o.h) }

// Percentile is the latency that p percent (0 to 100) of the recorded ones
// do not exceed; 0 when none were recorded.
func (h *Histogram) Percentile(p float64) time.Duration {
	return time.Duration(h.h.ValueAtPercentile(p)) * time.Microsecond
}

// Max is the largest latency recorded (to the histogram's precision).
func (h *Histogram) Max() time.Duration {
	return time.Duration(h.h.Max()) * time.Microsecond
}

// Percentiles are the latencies a report shows.
type Percentiles struct {
	P50, P90, P99, P999, Max time.Duration
}

// Summary returns the report's percentiles.
func (h *Histogram) Summary() Percentiles {
	return Percentiles{
		P50: h.Percentile(50), P90: h.Percentile(90), P99: h.Percentile(99),
		P999: h.Percentile(99.9), Max: h.Max(),
	}
}

// MarshalJSON encodes the whole histogram as a string (compressed HDR V2
// in base64), so worker processes can hand theirs to the parent to merge.
func (h *Histogram) MarshalJSON() ([]byte, error) {
	b, err := h.h.Encode(hdrhistogram.V2CompressedEncodingCookieBase)
	if err != nil {
		return nil, fmt.Errorf("workload: encode histogram: %w", err)
	}
	return json.Marshal(string(b))
}

// UnmarshalJSON decodes what MarshalJSON wrote.
func (h *Histogram) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return err
	}
	d, err := hdrhistogram.Decode([]byte(s))
	if err != nil {
		return fmt.Errorf("workload: decode histogram: %w", err)
	}
	h.h = d
	return nil
}
