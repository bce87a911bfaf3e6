package handlers

import (
	"context"
	"net/http"
	"sync/atomic"
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
	unreachable prometheus.Counter
	waits       *prometheus.CounterVec
	waited      prometheus.Histogram
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
		unreachable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "credpool_allocate_unreachable_total",
			Help: "Candidate keys an allocation skipped because their store server did not answer or refused the write (a Redis Cluster master that is down, read-only, out of memory or short of replicas).",
		}),
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "credpool_allocate_waits_total",
			Help: "Allocate requests that asked to wait for a slot (wait_ms), by result as in credpool_allocations_total: granted, pool_exhausted (the wait ran out), and others.",
		}, []string{"result"}),
		waited: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "credpool_allocate_wait_seconds",
			Help:    "Time an allocate request that asked to wait spent in line for a slot.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
	}
	reg.MustRegister(
		m.allocations, m.conflicts, m.attempts, m.latency, m.releases, m.renewals, m.reports, m.expired, m.unreachable,
		m.waits, m.waited,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// watchWaiting exports how many allocate requests wait in line for a
// slot, read at each scrape.
func (m *Metrics) watchWaiting(waiting func() int) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "credpool_allocate_waiting",
		Help: "Allocate requests of this process waiting in line for a slot (wait_ms).",
	}, func() float64 { return float64(waiting()) }))
}

// watchLogDrops exports how many log lines were dropped because the log's
// reader stalled, read at each scrape.
func (m *Metrics) watchLogDrops(dropped func() int64) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "credpool_log_lines_dropped_total",
		Help: "Log lines dropped because whatever reads the log (stderr) fell behind: a stalled reader never holds up a request.",
	}, func() float64 { return float64(dropped()) }))
}

// watchLiveReads exports how the live state ranking used was come by,
// read at each scrape.
func (m *Metrics) watchLiveReads(reads func() broker.LiveReads) {
	m.reg.MustRegister(&liveReadsCollector{
		reads: reads,
		desc: prometheus.NewDesc("credpool_rank_live_state_total",
			"Keys' live states (free slots, last grant) for ranking, by source: kept (ranked an allocate without a read), "+
				"read (by an allocate, in its own round trip) and background (read again once older than --live-max-age).",
			[]string{"source"}, nil),
	})
}

// liveReadsCollector reads the counts once per scrape. It is safe for
// concurrent use.
type liveReadsCollector struct {
	reads func() broker.LiveReads
	desc  *prometheus.Desc
}

func (c *liveReadsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *liveReadsCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.reads()
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(r.Kept), "kept")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(r.Read), "read")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(r.Background), "background")
}

// watchBacklog exports the broker's release backlog, read at each scrape.
func (m *Metrics) watchBacklog(backlog func() broker.Backlog) {
	m.reg.MustRegister(&backlogCollector{
		backlog: backlog,
		pending: prometheus.NewDesc("credpool_release_backlog",
			"Releases that met a store failure and are retried in the background.", nil, nil),
		released: prometheus.NewDesc("credpool_release_backlog_released_total",
			"Releases from the backlog that the store finally made.", nil, nil),
		lost: prometheus.NewDesc("credpool_release_backlog_lost_total",
			"Releases from the backlog whose lease was already gone (expired).", nil, nil),
		dropped: prometheus.NewDesc("credpool_release_backlog_dropped_total",
			"Failed releases not kept because the backlog was full: their leases expire by themselves.", nil, nil),
	})
}

// backlogCollector reads the backlog once per scrape, so its four numbers
// agree with each other. It is safe for concurrent use.
type backlogCollector struct {
	backlog                          func() broker.Backlog
	pending, released, lost, dropped *prometheus.Desc
}

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.released
	ch <- c.lost
	ch <- c.dropped
}

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	b := c.backlog()
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(b.Pending))
	ch <- prometheus.MustNewConstMetric(c.released, prometheus.CounterValue, float64(b.Released))
	ch <- prometheus.MustNewConstMetric(c.lost, prometheus.CounterValue, float64(b.Lost))
	ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(b.Dropped))
}

// watchLosses exports the keys the lease store lost, read at each scrape
// (the catalog's count, bounded to a second).
func (m *Metrics) watchLosses(report func(context.Context) (broker.LossReport, error)) {
	m.reg.MustRegister(&lossCollector{
		report: report,
		held: prometheus.NewDesc("credpool_store_lost_keys_held",
			"Keys whose state the lease store lost, held back until every lease it may have forgotten has ended; absent while the catalog cannot say.", nil, nil),
		total: prometheus.NewDesc("credpool_store_lost_keys_total",
			"Keys this process found missing from the lease store although it had them (a restart without persistence, a flush, a failover).", nil, nil),
	})
}

// lossCollector reads the loss report once per scrape. A failed read
// leaves held out (a 0 would say "all fine" just when nobody knows) and
// the total at the highest value seen, so the counter never goes back. It
// is safe for concurrent use.
type lossCollector struct {
	report      func(context.Context) (broker.LossReport, error)
	held, total *prometheus.Desc
	most        atomic.Int64 // the highest total reported so far
}

func (c *lossCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.held
	ch <- c.total
}

func (c *lossCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l, err := c.report(ctx)
	total := c.raise(l.Total)
	ch <- prometheus.MustNewConstMetric(c.total, prometheus.CounterValue, float64(total))
	if err == nil {
		ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(l.Held))
	}
}

// raise lifts the highest total seen to n if n is higher, and returns it.
func (c *lossCollector) raise(n int64) int64 {
	for {
		most := c.most.Load()
		if n <= most || c.most.CompareAndSwap(most, n) {
			return max(most, n)
		}
	}
}

// watchNodes exports whether each of the lease store's servers answered
// its last check.
func (m *Metrics) watchNodes(nodes func() []optimistic.NodeHealth) {
	m.reg.MustRegister(&nodeCollector{
		nodes: nodes,
		up: prometheus.NewDesc("credpool_store_node_up",
			"1 if the lease store's server (each master of a Redis Cluster; node=\"\" for a Redis behind Sentinel or the SQLite file) took its last check's write, else 0.", []string{"node"}, nil),
	})
}

// nodeCollector reads the last check at each scrape. It is safe for
// concurrent use.
type nodeCollector struct {
	nodes func() []optimistic.NodeHealth
	up    *prometheus.Desc
}

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.up }

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	for _, n := range c.nodes() {
		up := 1.0
		if n.Err != nil {
			up = 0
		}
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up, n.Addr)
	}
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

func (m *Metrics) observeAllocate(err error, st optimistic.Stats, d time.Duration, waiting bool) {
	m.allocations.WithLabelValues(resultLabel(err, "granted")).Inc()
	if waiting {
		m.waits.WithLabelValues(resultLabel(err, "granted")).Inc()
		m.waited.Observe(st.Waited.Seconds())
	}
	m.conflicts.Add(float64(st.Conflicts))
	m.expired.Add(float64(st.Pruned))
	m.unreachable.Add(float64(st.Unreachable))
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
