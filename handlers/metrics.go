package handlers

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/optimistic"
)

// Metrics are the service's Prometheus metrics, on a registry of their own.
// Labels carry results and outcomes only: no key ids (unbounded) and never
// secrets.
type Metrics struct {
	reg         *prometheus.Registry
	allocations *prometheus.CounterVec
	conflicts   prometheus.Counter
	attempts    prometheus.Histogram
	latency     prometheus.Histogram
	releases    *prometheus.CounterVec
	renewals    *prometheus.CounterVec
	reports     *prometheus.CounterVec
	expired     prometheus.Counter
}

// NewMetrics registers the metrics, plus the Go and process collectors.
func NewMetrics() *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		reg: reg,
		allocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "credpool_allocations_total",
			Help: "Allocate requests by result: granted, pool_exhausted, contended, no_candidates, policy_conflict, store_unavailable, and others.",
		}, []string{"result"}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "credpool_allocate_conflicts_total",
			Help: "Allocation attempts that lost a race and wrote nothing: an aborted EXEC (Redis WATCH) or a busy file (SQLite); most are retried.",
		}),
		attempts: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "credpool_allocate_attempts",
			Help:    "Store read-decide rounds per allocate request.",
			Buckets: []float64{1, 2, 3, 4, 6, 8, 12, 16, 24, 32},
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "credpool_allocate_duration_seconds",
			Help:    "Allocate request latency in the service.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "credpool_releases_total",
			Help: "Releases by source (release, report) and result: released, not_found_or_expired, owner_mismatch, error.",
		}, []string{"source", "result"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "credpool_renewals_total",
			Help: "Renewals by result: renewed, lease_lost, or an error code.",
		}, []string{"result"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "credpool_reports_total",
			Help: "Usage reports by outcome.",
		}, []string{"outcome"}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "credpool_leases_expired_total",
			Help: "Leases that expired without release, counted when an allocation prunes them.",
		}),
	}
	reg.MustRegister(
		m.allocations, m.conflicts, m.attempts, m.latency, m.releases, m.renewals, m.reports, m.expired,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// watchBacklog exports the broker's release backlog, read at each scrape.
func (m *Metrics) watchBacklog(backlog func() broker.Backlog) {
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "credpool_release_backlog",
			Help: "Releases that met a store failure and are retried in the background.",
		}, func() float64 { return float64(backlog().Pending) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "credpool_release_backlog_released_total",
			Help: "Releases from the backlog that the store finally made.",
		}, func() float64 { return float64(backlog().Released) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "credpool_release_backlog_lost_total",
			Help: "Releases from the backlog whose lease was already gone (expired).",
		}, func() float64 { return float64(backlog().Lost) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "credpool_release_backlog_dropped_total",
			Help: "Failed releases not kept because the backlog was full: their leases expire by themselves.",
		}, func() float64 { return float64(backlog().Dropped) }),
	)
}

// watchLosses exports the keys the lease store lost, read at each scrape
// (the catalog's count, bounded to a second).
func (m *Metrics) watchLosses(report func(context.Context) (broker.LossReport, error)) {
	losses := func() broker.LossReport {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		l, _ := report(ctx)
		return l
	}
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "credpool_store_lost_keys_held",
			Help: "Keys whose state the lease store lost, held back until every lease it may have forgotten has ended.",
		}, func() float64 { return float64(losses().Held) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "credpool_store_lost_keys_total",
			Help: "Keys this process found missing from the lease store although it had them (a restart without persistence, a flush, a failover).",
		}, func() float64 { return float64(losses().Total) }),
	)
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

func (m *Metrics) observeAllocate(err error, st optimistic.Stats, d time.Duration) {
	m.allocations.WithLabelValues(resultLabel(err, "granted")).Inc()
	m.conflicts.Add(float64(st.Conflicts))
	m.expired.Add(float64(st.Pruned))
	m.attempts.Observe(float64(st.Attempts))
	m.latency.Observe(d.Seconds())
}

// resultLabel is a metric's result label: ok on success, else the error
// code statusFor gives err.
func resultLabel(err error, ok string) string {
	if err == nil {
		return ok
	}
	_, code := statusFor(err)
	return code
}
