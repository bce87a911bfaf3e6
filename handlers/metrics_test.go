package handlers

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
)

// scrape serves m's metrics once and returns the value of each named
// metric present.
func scrape(t *testing.T, m *Metrics, names ...string) map[string]float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	out := map[string]float64{}
	for line := range strings.Lines(rec.Body.String()) {
		name, value, _ := strings.Cut(strings.TrimSpace(line), " ")
		if slices.Contains(names, name) {
			v, err := strconv.ParseFloat(value, 64)
			require.NoError(t, err, line)
			out[name] = v
		}
	}
	return out
}

// While the catalog fails, the loss count stays where it was (a counter
// never goes back) and the held keys are left out rather than shown as 0;
// every scrape asks the catalog once.
func TestLossMetricsWhileTheCatalogFails(t *testing.T) {
	var (
		calls  int
		report = broker.LossReport{Held: 2, Total: 3}
		fail   error
	)
	m := NewMetrics()
	m.watchLosses(func(context.Context) (broker.LossReport, error) {
		calls++
		if fail != nil {
			// As broker.Admin.Losses answers when the catalog fails.
			return broker.LossReport{}, fail
		}
		return report, nil
	})
	const held, total = "credpool_store_lost_keys_held", "credpool_store_lost_keys_total"

	require.Equal(t, map[string]float64{held: 2, total: 3}, scrape(t, m, held, total))
	require.Equal(t, 1, calls, "one catalog read per scrape")

	fail = errors.New("catalog: database is closed")
	require.Equal(t, map[string]float64{total: 3}, scrape(t, m, held, total), "held unknown, total kept")
	require.Equal(t, 2, calls, "one catalog read per scrape")

	fail, report = nil, broker.LossReport{Held: 0, Total: 4}
	require.Equal(t, map[string]float64{held: 0, total: 4}, scrape(t, m, held, total))
}

// The backlog's numbers come from one read per scrape.
func TestBacklogMetricsReadOncePerScrape(t *testing.T) {
	calls := 0
	m := NewMetrics()
	m.watchBacklog(func() broker.Backlog {
		calls++
		return broker.Backlog{Pending: 1, Released: 2, Lost: 3, Dropped: 4}
	})
	got := scrape(t, m, "credpool_release_backlog", "credpool_release_backlog_released_total",
		"credpool_release_backlog_lost_total", "credpool_release_backlog_dropped_total")
	require.Equal(t, map[string]float64{
		"credpool_release_backlog": 1, "credpool_release_backlog_released_total": 2,
		"credpool_release_backlog_lost_total": 3, "credpool_release_backlog_dropped_total": 4,
	}, got)
	require.Equal(t, 1, calls)
}

// The live-state counts come from one read per scrape, one series per
// source.
func TestLiveReadsMetrics(t *testing.T) {
	calls := 0
	m := NewMetrics()
	m.watchLiveReads(func() broker.LiveReads {
		calls++
		return broker.LiveReads{Kept: 5, Read: 2, Background: 1}
	})
	const name = "credpool_rank_live_state_total"
	got := scrape(t, m, name+`{source="kept"}`, name+`{source="read"}`, name+`{source="background"}`)
	require.Equal(t, map[string]float64{
		name + `{source="kept"}`: 5, name + `{source="read"}`: 2, name + `{source="background"}`: 1,
	}, got)
	require.Equal(t, 1, calls)
}
