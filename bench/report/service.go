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
	Env Env `json:"env"`
	// Postgres is the version of the throwaway PostgreSQL server that held
	// the catalogs; empty when they were SQLite files.
	Postgres string        `json:"postgres,omitempty"`
	Cells    []ServiceCell `json:"cells"`
}

// ServiceCell is one service configuration and workload, measured Reps
// times. The summary fields are medians and ranges over Reps (Summarize).
type ServiceCell struct {
	// Strategy is the lease store under the service and the one measured
	// alone: "sqlite" (credpool serve without --redis) or "optimistic"
	// (serve --redis).
	Strategy string `json:"strategy"`
	// Catalog is where the service kept its catalog: "sqlite" (a file) or
	// "postgres" (a fresh database per strategy on a throwaway server).
	Catalog string `json:"catalog"`
	// CatalogEach says that each of several instances had a catalog of
	// its own, with the same keys, instead of one they shared (a control).
	CatalogEach bool `json:"catalog_each,omitempty"`
	// Instances is how many credpool serve processes shared the lease
	// store and, unless CatalogEach, the catalog, the callers spread
	// round-robin over them.
	Instances int    `json:"instances"`
	Keys      int    `json:"keys"`
	Limit     int    `json:"limit"`
	Workers   int    `json:"workers"`
	Duration  string `json:"duration"`
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
	// VsFewest is the cycles/s over those of the fewest instances
	// measured, taken within each repetition (1 in the fewest's cells).
	VsFewest Spread `json:"vs_fewest_instances"`
}

// ServiceRep is one repetition of a cell: the service run and the store
// run, one after the other. With several instance counts, one repetition
// runs the service at each, fewest first, and then the store, or all in
// the reverse order; the cells of every instance count share its store
// run.
type ServiceRep struct {
	// ServiceFirst says the service ran before the store; repetitions
	// alternate, so an even number of them favours neither order.
	ServiceFirst bool       `json:"service_first"`
	Service      ServiceRun `json:"service"`
	// Store is the lease store alone under the bench harness, with the
	// cell's keys, limit and callers, each calling Allocate then Release at
	// once.
	Store        Run     `json:"store"`
	ShareOfStore float64 `json:"share_of_store"`
	// VsFewest is Service's cycles/s over those of the fewest instances in
	// the same repetition.
	VsFewest float64 `json:"vs_fewest_instances"`
}

// ServiceRun is one measured run of the service: callers that allocate
// over HTTP and, when granted, at once report success (which releases).
type ServiceRun struct {
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	// Cycles counts allocates answered 200 whose report answered 200 and
	// released the lease.
	Cycles       int64   `json:"cycles"`
	CyclesPerSec float64 `json:"cycles_per_sec"`
	// InstanceCycles are the Cycles through each instance the run used.
	InstanceCycles []int64 `json:"instance_cycles"`
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
	// Conflicts counts the allocation attempts, in all the instances the
	// run used, that lost a race (most were tried again), from their
	// metrics; nil if they could not be read.
	Conflicts *int64 `json:"conflicts,omitempty"`
	// AllocateLatency is over allocates answered 200, ReportLatency over
	// reports answered 200: request sent to answer read.
	AllocateLatency Latency `json:"allocate_latency_ms"`
	ReportLatency   Latency `json:"report_latency_ms"`
	// Audit is the harness's holder count per key at every grant, and the
	// lease store's live leases read through the admin API during the run
	// (callers give their grants up at once: see Audit.Samples).
	Audit      Audit  `json:"audit"`
	FirstError string `json:"first_error,omitempty"`
}

// conflictsPerCycle is Conflicts per cycle, "n/a" if unknown.
func (s ServiceRun) conflictsPerCycle() string {
	if s.Conflicts == nil || s.Cycles == 0 {
		return "n/a"
	}
	return fmtFloat(float64(*s.Conflicts) / float64(s.Cycles))
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
	c.VsFewest = over(func(r ServiceRep) float64 { return r.VsFewest })
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
	r.markdownSetUp(&b)
	r.markdownAudit(&b)
	r.markdownMedians(&b)
	r.markdownReps(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// serviceReading says what each figure includes.
const serviceReading = `**What is measured.** *Service*: ` + "`credpool serve`" + ` as its own process on loopback, ` +
	`with a fresh catalog (and, for optimistic, leases in Redis), driven over HTTP by the harness's callers in a ` +
	`closed loop: POST /api/internal/allocate-key, and when granted at once POST /api/internal/report with ` +
	`outcome success, which releases. A *cycle* is both answered 200 with the lease released. Latencies run from ` +
	`sending a request to reading its answer: HTTP over kept-alive connections (each caller's own, opened before ` +
	`the clock starts, on which the caller writes and reads HTTP/1.1 itself: net/http's client spent about ` +
	`1.6–2× the CPU per cycle on the CPUs the service shares), routing, auth, JSON, the request log line, the ` +
	`broker's catalog reads and ranking (with the live state it keeps, see --live-max-age), the store's ` +
	`Allocate or Release, and what the catalog does on the request path (its generation read at the re-check, and before an answer of no grant; uses are written behind, once a second). After an answer other than 200 a caller ` +
	`pauses as after "no slot". *Store*: the same lease store alone, in the harness's process (no HTTP, no catalog), ` +
	`with the same keys, limit and callers, each listing every key in its own random order, as the broker ` +
	`does, and releasing at once (hold 0); its latency is of granted Allocate calls. *Service/store* is cycles/s ` +
	`over store grants/s within each repetition. Callers, service, redis-server and PostgreSQL share the machine's CPUs.` + "\n\n"

// markdownSetUp says where the catalog was and how several instances
// shared it, when either is not the plain case of one SQLite file.
func (r *ServiceReport) markdownSetUp(b *strings.Builder) {
	each := slices.ContainsFunc(r.Cells, func(c ServiceCell) bool { return c.CatalogEach })
	if r.Postgres != "" {
		opens := "one fresh database per lease store, which every instance opens"
		if each {
			opens = "one fresh database per lease store and instance"
		}
		fmt.Fprintf(b, "**The catalog in PostgreSQL.** PostgreSQL %s on loopback, started by the harness with "+
			"fsync, synchronous_commit and full_page_writes off (its data is thrown away); %s "+
			"(`--db postgres://…`, passed in the environment).\n\n", r.Postgres, opens)
	}
	fewest, most := r.instanceRange()
	if fewest == most {
		return
	}
	if each {
		fmt.Fprintf(b, "**Instances, a catalog each.** A control: with N instances, N `credpool serve` processes share "+
			"the lease store and the API keys, but each has a catalog of its own (\"one each\" in the tables) holding "+
			"the same keys, loaded through each instance, so no catalog is shared. Each instance must grant once before "+
			"anything is measured, and caller i calls instance i mod N. All %d instances run throughout, the ones a run "+
			"does not use idle. *vs %d* is the cycles/s over those at the fewest instances, %d, in the same repetition.\n\n",
			most, fewest, fewest)
		return
	}
	fmt.Fprintf(b, "**Instances.** With N instances, N `credpool serve` processes share the catalog, the lease store "+
		"and the API keys; the keys are loaded through the first, each instance must grant once before anything is "+
		"measured, and caller i calls instance i mod N. All %d instances run throughout, the ones a run does not use "+
		"idle. *vs %d* is the cycles/s over those at the fewest instances, %d, in the same repetition.\n\n", most, fewest, fewest)
}

// instanceRange is the fewest and the most instances of any cell.
func (r *ServiceReport) instanceRange() (fewest, most int) {
	for i, c := range r.Cells {
		if i == 0 || c.Instances < fewest {
			fewest = c.Instances
		}
		most = max(most, c.Instances)
	}
	return fewest, most
}

func (r *ServiceReport) markdownAudit(b *strings.Builder) {
	if !r.Failed() {
		// A store run is shared by the cells of every instance count.
		fewest, _ := r.instanceRange()
		runs, samples := 0, 0
		for _, c := range r.Cells {
			runs += len(c.Reps)
			for _, rep := range c.Reps {
				samples += rep.Service.Audit.Samples
				if c.Instances == fewest {
					samples += rep.Store.Audit.Samples
				}
			}
			if c.Instances == fewest {
				runs += len(c.Reps)
			}
		}
		fmt.Fprintf(b, "**Oversell audit: passed.** In all %d runs no key ever had more holders than its limit "+
			"(harness count at every grant), and no key had more live leases than its limit in the lease store's own state, "+
			"read every 20 ms during each run (%d reads in all; the service's through its admin API), and for the store "+
			"alone also afterwards. Callers give their grants up at once, so the holder count alone would rarely see "+
			"two leases overlap.\n\n", runs, samples)
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
						"%d times a key over its limit in the store; first: %s\n", a.what, serviceLabel(c), i+1,
						a.audit.HolderViolations, a.audit.MaxHolders, c.Limit, a.audit.StateViolations, a.audit.First)
				}
			}
		}
	}
	b.WriteString("\n")
}

func serviceLabel(c ServiceCell) string {
	return fmt.Sprintf("%s on %s × %d, limit %d, %d workers", c.Strategy, c.CatalogName(), c.Instances, c.Limit, c.Workers)
}

// CatalogName is where the cell's instances kept their catalog, as the
// tables and the progress lines show it: "sqlite", "postgres, one each".
func (c ServiceCell) CatalogName() string {
	if c.CatalogEach {
		return c.Catalog + ", one each"
	}
	return c.Catalog
}

func (r *ServiceReport) markdownMedians(b *strings.Builder) {
	b.WriteString("## Service against its store\n\n")
	b.WriteString("Medians over the repetitions, with the range (min–max); latencies in ms.\n\n")
	fewest, most := r.instanceRange()
	head := []string{"store", "catalog", "instances", "keys", "limit", "workers", "reps × duration", "cycles/s", "allocate p50",
		"allocate p99", "report p50", "report p99", "store grants/s", "store p50", "store p99", "service/store"}
	if fewest != most {
		head = append(head, fmt.Sprintf("vs %d", fewest))
	}
	var rows [][]string
	for _, c := range r.Cells {
		row := []string{
			c.Strategy, c.CatalogName(), strconv.Itoa(c.Instances), strconv.Itoa(c.Keys), strconv.Itoa(c.Limit), strconv.Itoa(c.Workers),
			fmt.Sprintf("%d × %s", len(c.Reps), c.Duration),
			spread(c.CyclesPerSec, fmtRate), spread(c.AllocateP50, fmtMs), spread(c.AllocateP99, fmtMs),
			spread(c.ReportP50, fmtMs), spread(c.ReportP99, fmtMs), spread(c.StoreGrantsPerSec, fmtRate),
			spread(c.StoreP50, fmtMs), spread(c.StoreP99, fmtMs), spread(c.ShareOfStore, fmtPercent),
		}
		if fewest != most {
			row = append(row, spread(c.VsFewest, fmtTimes))
		}
		rows = append(rows, row)
	}
	writeTable(b, head, rows)
}

func (r *ServiceReport) markdownReps(b *strings.Builder) {
	b.WriteString("## Every repetition\n\n")
	b.WriteString("Allocate and report answers by HTTP status; dials are connections opened during the run; conflicts are the allocation attempts, in all the instances used, that lost a race (a WATCH abort, or a busy SQLite file; most were tried again).\n\n")
	fewest, most := r.instanceRange()
	head := []string{"store", "catalog", "instances", "limit", "workers", "rep", "first", "cycles/s", "allocate p50", "allocate p99",
		"report p50", "report p99", "allocate answers", "report answers", "dials", "conflicts/cycle", "store grants/s", "store p99",
		"service/store"}
	if fewest != most {
		head = append(head, fmt.Sprintf("vs %d", fewest))
	}
	var rows [][]string
	var notes []string
	for _, c := range r.Cells {
		for i, rep := range c.Reps {
			s := rep.Service
			first := "store"
			if rep.ServiceFirst {
				first = "service"
			}
			row := []string{
				c.Strategy, c.CatalogName(), strconv.Itoa(c.Instances), strconv.Itoa(c.Limit), strconv.Itoa(c.Workers), strconv.Itoa(i + 1), first,
				fmtRate(s.CyclesPerSec), fmtMs(s.AllocateLatency.P50), fmtMs(s.AllocateLatency.P99),
				fmtMs(s.ReportLatency.P50), fmtMs(s.ReportLatency.P99), statuses(s.AllocateStatus),
				statuses(s.ReportStatus), strconv.FormatInt(s.Dials, 10), s.conflictsPerCycle(), fmtRate(rep.Store.GrantsPerSec),
				fmtMs(rep.Store.GrantLatency.P99), fmtPercent(rep.ShareOfStore),
			}
			if fewest != most {
				row = append(row, fmtTimes(rep.VsFewest))
			}
			rows = append(rows, row)
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

// fmtTimes formats a ratio already taken as Ratio does.
func fmtTimes(v float64) string { return Ratio(v, 1) }

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
