package report

import (
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ServiceReport is one "credpool bench -service" invocation: the service,
// credpool serve over HTTP, against its own lease store alone, cell by
// cell, each measured several times.
type ServiceReport struct {
	Env   Env           `json:"env"`
	Cells []ServiceCell `json:"cells"`
}

// ServiceCell is one service configuration and workload, measured Reps
// times. The summary fields are medians and ranges over Reps (Summarize).
type ServiceCell struct {
	// Strategy is the lease store under the service and the one measured
	// alone: "sqlite" (credpool serve without --redis) or "optimistic"
	// (serve --redis).
	Strategy string `json:"strategy"`
	Keys     int    `json:"keys"`
	Limit    int    `json:"limit"`
	Workers  int    `json:"workers"`
	Duration string `json:"duration"`
	// LeaseSeconds is the lease_seconds of every allocate, and the store
	// run's TTL.
	LeaseSeconds int          `json:"lease_seconds"`
	Pause        string       `json:"pause"`
	Reps         []ServiceRep `json:"reps"`

	CyclesPerSec      Spread `json:"cycles_per_sec"`
	AllocateP50       Spread `json:"allocate_p50_ms"`
	AllocateP99       Spread `json:"allocate_p99_ms"`
	ReportP50         Spread `json:"report_p50_ms"`
	ReportP99         Spread `json:"report_p99_ms"`
	StoreGrantsPerSec Spread `json:"store_grants_per_sec"`
	StoreP50          Spread `json:"store_p50_ms"`
	StoreP99          Spread `json:"store_p99_ms"`
	// ShareOfStore is the service's cycles/s over its store's grants/s,
	// taken within each repetition.
	ShareOfStore Spread `json:"share_of_store"`
}

// ServiceRep is one repetition of a cell: the service run and the store
// run, one after the other.
type ServiceRep struct {
	// ServiceFirst says the service ran before the store; repetitions
	// alternate, so neither order is always favoured.
	ServiceFirst bool       `json:"service_first"`
	Service      ServiceRun `json:"service"`
	// Store is the lease store alone under the bench harness, with the
	// cell's keys, limit and callers, each calling Allocate then Release at
	// once.
	Store        Run     `json:"store"`
	ShareOfStore float64 `json:"share_of_store"`
}

// ServiceRun is one measured run of the service: callers that allocate
// over HTTP and, when granted, at once report success (which releases).
type ServiceRun struct {
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	// Cycles counts allocates answered 200 whose report answered 200 and
	// released the lease.
	Cycles       int64   `json:"cycles"`
	CyclesPerSec float64 `json:"cycles_per_sec"`
	// AllocateStatus counts allocate calls by HTTP status ("200", "429",
	// "503", …; "no_response" when none came back); they sum to
	// AllocateCalls. ReportStatus is the same for reports.
	AllocateCalls  int64            `json:"allocate_calls"`
	AllocateStatus map[string]int64 `json:"allocate_status"`
	ReportCalls    int64            `json:"report_calls"`
	ReportStatus   map[string]int64 `json:"report_status"`
	// NotReleased counts reports answered 200 that released nothing: the
	// lease had expired (the lease was too short for the run).
	NotReleased int64 `json:"not_released"`
	// Dials counts connections the clients opened during the run; they
	// are opened before it, so anything above zero is connection set-up
	// measured.
	Dials int64 `json:"dials"`
	// AllocateLatency is over allocates answered 200, ReportLatency over
	// reports answered 200: request sent to answer read.
	AllocateLatency Latency `json:"allocate_latency_ms"`
	ReportLatency   Latency `json:"report_latency_ms"`
	// Audit is the harness's holder count per key at every grant; the
	// service has no store-state check.
	Audit      Audit  `json:"audit"`
	FirstError string `json:"first_error,omitempty"`
}

// Spread is one figure over repeated runs: the median and the range.
type Spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// SpreadOf is the median and range of vs; zero for none.
func SpreadOf(vs []float64) Spread {
	if len(vs) == 0 {
		return Spread{}
	}
	s := slices.Sorted(slices.Values(vs))
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Spread{Median: med, Min: s[0], Max: s[n-1]}
}

// Summarize fills c's medians and ranges from its Reps.
func (c *ServiceCell) Summarize() {
	over := func(get func(ServiceRep) float64) Spread {
		vs := make([]float64, len(c.Reps))
		for i, r := range c.Reps {
			vs[i] = get(r)
		}
		return SpreadOf(vs)
	}
	c.CyclesPerSec = over(func(r ServiceRep) float64 { return r.Service.CyclesPerSec })
	c.AllocateP50 = over(func(r ServiceRep) float64 { return r.Service.AllocateLatency.P50 })
	c.AllocateP99 = over(func(r ServiceRep) float64 { return r.Service.AllocateLatency.P99 })
	c.ReportP50 = over(func(r ServiceRep) float64 { return r.Service.ReportLatency.P50 })
	c.ReportP99 = over(func(r ServiceRep) float64 { return r.Service.ReportLatency.P99 })
	c.StoreGrantsPerSec = over(func(r ServiceRep) float64 { return r.Store.GrantsPerSec })
	c.StoreP50 = over(func(r ServiceRep) float64 { return r.Store.GrantLatency.P50 })
	c.StoreP99 = over(func(r ServiceRep) float64 { return r.Store.GrantLatency.P99 })
	c.ShareOfStore = over(func(r ServiceRep) float64 { return r.ShareOfStore })
}

// Failed reports whether any audit failed, of the service or the store.
func (r *ServiceReport) Failed() bool {
	for _, c := range r.Cells {
		for _, rep := range c.Reps {
			if !rep.Service.Audit.OK() || !rep.Store.Audit.OK() {
				return true
			}
		}
	}
	return false
}

// WriteJSON writes the report as indented JSON.
func (r *ServiceReport) WriteJSON(w io.Writer) error { return writeJSON(w, r) }

// WriteFiles writes the JSON and the Markdown summary into dir, creating
// it, and returns the paths written.
func (r *ServiceReport) WriteFiles(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	var written []string
	for _, f := range []struct {
		name  string
		write func(io.Writer) error
	}{{JSONFile, r.WriteJSON}, {MarkdownFile, r.WriteMarkdown}} {
		path := filepath.Join(dir, f.name)
		if err := writeFile(path, f.write); err != nil {
			return written, err
		}
		written = append(written, path)
	}
	return written, nil
}

// WriteMarkdown writes the machine, what the figures include, the audit
// verdict, the medians per cell and every repetition.
func (r *ServiceReport) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	(&Report{Env: r.Env}).markdownEnv(&b)
	b.WriteString(serviceReading)
	r.markdownAudit(&b)
	r.markdownMedians(&b)
	r.markdownReps(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// serviceReading says what each figure includes.
const serviceReading = `**What is measured.** *Service*: ` + "`credpool serve`" + ` as its own process on loopback, ` +
	`with a fresh SQLite catalog (and, for optimistic, leases in Redis), driven over HTTP by the harness's callers in a ` +
	`closed loop: POST /api/internal/allocate-key, and when granted at once POST /api/internal/report with ` +
	`outcome success, which releases. A *cycle* is both answered 200 with the lease released. Latencies run from ` +
	`sending a request to reading its answer: HTTP over kept-alive connections (opened before the clock starts), ` +
	`routing, auth, JSON, the request log line, the broker's catalog reads and ranking, the store's ` +
	`Allocate or Release, and the catalog writes of a grant and of a report. After an answer other than 200 a caller ` +
	`pauses as after "no slot". *Store*: the same lease store alone, in the harness's process (no HTTP, no catalog), ` +
	`with the same keys, limit and callers, each listing every key in its own random order, as the broker ` +
	`does, and releasing at once (hold 0); its latency is of granted Allocate calls. *Service/store* is cycles/s ` +
	`over store grants/s within each repetition. Callers, service and redis-server share the machine's CPUs.` + "\n\n"

func (r *ServiceReport) markdownAudit(b *strings.Builder) {
	if !r.Failed() {
		runs := 0
		for _, c := range r.Cells {
			runs += 2 * len(c.Reps)
		}
		fmt.Fprintf(b, "**Oversell audit: passed.** In all %d runs no key ever had more holders than its limit "+
			"(harness count at every grant; for the store also its own state afterwards).\n\n", runs)
		return
	}
	b.WriteString("**Oversell audit: FAILED.**\n\n")
	for _, c := range r.Cells {
		for i, rep := range c.Reps {
			for _, a := range []struct {
				what  string
				audit Audit
			}{{"service", rep.Service.Audit}, {"store", rep.Store.Audit}} {
				if !a.audit.OK() {
					fmt.Fprintf(b, "- %s, %s, repetition %d: %d holder violations (max %d holders, limit %d), "+
						"%d keys over the limit in the store; first: %s\n", a.what, serviceLabel(c), i+1,
						a.audit.HolderViolations, a.audit.MaxHolders, c.Limit, a.audit.StateViolations, a.audit.First)
				}
			}
		}
	}
	b.WriteString("\n")
}

func serviceLabel(c ServiceCell) string {
	return fmt.Sprintf("%s limit %d, %d workers", c.Strategy, c.Limit, c.Workers)
}

func (r *ServiceReport) markdownMedians(b *strings.Builder) {
	b.WriteString("## Service against its store\n\n")
	b.WriteString("Medians over the repetitions, with the range (min–max); latencies in ms.\n\n")
	head := []string{"store", "keys", "limit", "workers", "reps × duration", "cycles/s", "allocate p50",
		"allocate p99", "report p50", "report p99", "store grants/s", "store p50", "store p99", "service/store"}
	var rows [][]string
	for _, c := range r.Cells {
		rows = append(rows, []string{
			c.Strategy, strconv.Itoa(c.Keys), strconv.Itoa(c.Limit), strconv.Itoa(c.Workers),
			fmt.Sprintf("%d × %s", len(c.Reps), c.Duration),
			spread(c.CyclesPerSec, fmtRate), spread(c.AllocateP50, fmtMs), spread(c.AllocateP99, fmtMs),
			spread(c.ReportP50, fmtMs), spread(c.ReportP99, fmtMs), spread(c.StoreGrantsPerSec, fmtRate),
			spread(c.StoreP50, fmtMs), spread(c.StoreP99, fmtMs), spread(c.ShareOfStore, fmtPercent),
		})
	}
	writeTable(b, head, rows)
}

func (r *ServiceReport) markdownReps(b *strings.Builder) {
	b.WriteString("## Every repetition\n\n")
	b.WriteString("Allocate and report answers by HTTP status; dials are connections opened during the run.\n\n")
	head := []string{"store", "limit", "workers", "rep", "first", "cycles/s", "allocate p50", "allocate p99",
		"report p50", "report p99", "allocate answers", "report answers", "dials", "store grants/s", "store p99",
		"service/store"}
	var rows [][]string
	var notes []string
	for _, c := range r.Cells {
		for i, rep := range c.Reps {
			s := rep.Service
			first := "store"
			if rep.ServiceFirst {
				first = "service"
			}
			rows = append(rows, []string{
				c.Strategy, strconv.Itoa(c.Limit), strconv.Itoa(c.Workers), strconv.Itoa(i + 1), first,
				fmtRate(s.CyclesPerSec), fmtMs(s.AllocateLatency.P50), fmtMs(s.AllocateLatency.P99),
				fmtMs(s.ReportLatency.P50), fmtMs(s.ReportLatency.P99), statuses(s.AllocateStatus),
				statuses(s.ReportStatus), strconv.FormatInt(s.Dials, 10), fmtRate(rep.Store.GrantsPerSec),
				fmtMs(rep.Store.GrantLatency.P99), fmtPercent(rep.ShareOfStore),
			})
			if s.FirstError != "" {
				notes = append(notes, fmt.Sprintf("- %s, repetition %d: service: first error: %s", serviceLabel(c), i+1, s.FirstError))
			}
			if s.NotReleased > 0 {
				notes = append(notes, fmt.Sprintf("- %s, repetition %d: service: %d reports found the lease expired", serviceLabel(c), i+1, s.NotReleased))
			}
			if rep.Store.FirstError != "" {
				notes = append(notes, fmt.Sprintf("- %s, repetition %d: store: first error: %s", serviceLabel(c), i+1, rep.Store.FirstError))
			}
		}
	}
	writeTable(b, head, rows)
	for _, n := range notes {
		b.WriteString(n + "\n")
	}
}

// spread formats a Spread as "median (min–max)".
func spread(s Spread, f func(float64) string) string {
	return fmt.Sprintf("%s (%s–%s)", f(s.Median), f(s.Min), f(s.Max))
}

// fmtPercent formats a share as a percentage.
func fmtPercent(v float64) string {
	return strconv.FormatFloat(100*v, 'f', 1, 64) + "%"
}

// statuses formats status counts as "200: 950, 429: 3", by status.
func statuses(m map[string]int64) string {
	if len(m) == 0 {
		return "–"
	}
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
