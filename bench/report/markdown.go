package report

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// WriteMarkdown writes the machine, the audit verdict, a table with the
// strategies side by side (with the optimistic/lua ratio when both ran) and
// a table of every metric of every run.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	r.markdownEnv(&b)
	r.markdownAudit(&b)
	r.markdownSideBySide(&b)
	r.markdownAll(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *Report) markdownEnv(b *strings.Builder) {
	e := r.Env
	fmt.Fprintf(b, "# credpool bench, %s\n\n", e.Started.Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(b, "`%s`\n\n", e.CommandLine)
	b.WriteString("| | |\n|---|---|\n")
	fmt.Fprintf(b, "| machine | %s/%s, %d CPUs, GOMAXPROCS %d, %s |\n", e.OS, e.Arch, e.NumCPU, e.GOMAXPROCS, orDash(e.CPUModel))
	fmt.Fprintf(b, "| Go | %s, go-redis %s |\n", e.GoVersion, e.GoRedis)
	if e.Redis != "" {
		fmt.Fprintf(b, "| Redis | %s (%s) |\n", e.Redis, e.RedisServer)
	}
	fmt.Fprintf(b, "| strategies | %s |\n\n", strings.Join(r.strategies(), ", "))
}

func (r *Report) markdownAudit(b *strings.Builder) {
	if !r.Failed() {
		fmt.Fprintf(b, "**Oversell audit: passed.** In all %d runs no key ever had more holders than its limit "+
			"(harness count at every grant) and none had more live leases than its limit in the store afterwards.\n\n", len(r.Runs))
		return
	}
	b.WriteString("**Oversell audit: FAILED.**\n\n")
	for _, run := range r.Runs {
		if !run.Audit.OK() {
			fmt.Fprintf(b, "- %s, %s: %d holder violations (max %d holders, limit %d), %d keys over the limit in the store; first: %s\n",
				run.Strategy, cellLabel(run), run.Audit.HolderViolations, run.Audit.MaxHolders, run.Limit,
				run.Audit.StateViolations, run.Audit.First)
		}
	}
	b.WriteString("\n")
}

// cellLabel describes a cell in one phrase.
func cellLabel(r Run) string {
	return fmt.Sprintf("%s %s limit %d, %d workers, %d procs", r.Scenario, r.LoopLabel(), r.Limit, r.Workers, r.Procs)
}

func (r *Report) markdownSideBySide(b *strings.Builder) {
	names := r.strategies()
	ratio := r.hasRatio()
	b.WriteString("## Side by side\n\n")
	b.WriteString("Grants per second, p99 latency of a granted allocation (ms), EXEC conflicts per grant " +
		"and Redis round trips per grant")
	if ratio {
		fmt.Fprintf(b, "; the ratio columns are %s / %s", RatioNum, RatioDen)
	}
	b.WriteString(".\n\n")
	head := []string{"scenario", "loop", "limit", "workers", "procs"}
	group := func(metric string, withRatio bool) {
		for _, n := range names {
			head = append(head, metric+" "+n)
		}
		if withRatio {
			head = append(head, RatioNum+"/"+RatioDen)
		}
	}
	group("grants/s", ratio)
	group("p99", ratio)
	group("conflicts/grant", false)
	group("round trips/grant", false)
	var rows [][]string
	for _, rw := range r.rows() {
		c := rw.cell
		cells := []string{c.Scenario, c.LoopLabel(), strconv.Itoa(c.Limit), strconv.Itoa(c.Workers), strconv.Itoa(c.Procs)}
		metric := func(get func(*Run) string, num func(*Run) float64) {
			for _, n := range names {
				if run := rw.by[n]; run != nil {
					cells = append(cells, get(run))
				} else {
					cells = append(cells, "–")
				}
			}
			if num != nil {
				cells = append(cells, rw.ratio(num))
			}
		}
		var grants, p99 func(*Run) float64
		if ratio {
			grants = func(r *Run) float64 { return r.GrantsPerSec }
			p99 = func(r *Run) float64 { return r.GrantLatency.P99 }
		}
		metric(func(r *Run) string { return fmtRate(r.GrantsPerSec) }, grants)
		metric(func(r *Run) string { return fmtMs(r.GrantLatency.P99) }, p99)
		metric(func(r *Run) string { return fmtPer(r.ConflictsPerGrant) }, nil)
		metric(func(r *Run) string { return fmtPer(r.RoundTripsPerGrant) }, nil)
		rows = append(rows, cells)
	}
	writeTable(b, head, rows)
}

// ratio formats get(RatioNum)/get(RatioDen) for the row, "–" if either is
// missing.
func (rw row) ratio(get func(*Run) float64) string {
	num, den := rw.by[RatioNum], rw.by[RatioDen]
	if num == nil || den == nil {
		return "–"
	}
	return Ratio(get(num), get(den))
}

func (r *Report) markdownAll(b *strings.Builder) {
	b.WriteString("## Every metric\n\n")
	b.WriteString("Rates are per second of the run; latencies (ms) are of granted allocations, from the intended start " +
		"in an open loop; conflicts are aborted EXECs (SQLite: busy retries); attempts are candidate reads " +
		"(SQLite: transactions); round trips are requests the clients sent (a pipeline or MULTI…EXEC is one); " +
		"commands are what the server ran by INFO commandstats, commands inside Lua scripts included, " +
		"connection set-up left out. Per-grant figures count releases too.\n\n")
	head := []string{"strategy", "scenario", "loop", "limit", "workers", "procs", "grants/s", "no-slot/s", "give-ups/s",
		"errors/s", "conflicts/grant", "attempts/grant", "round trips/grant", "cmds/grant", "p50", "p90", "p99",
		"p99.9", "max", "max holders", "audit"}
	var rows [][]string
	for _, run := range r.Runs {
		audit := "ok"
		if !run.Audit.OK() {
			audit = fmt.Sprintf("**FAILED** (%d+%d)", run.Audit.HolderViolations, run.Audit.StateViolations)
		}
		l := run.GrantLatency
		rows = append(rows, []string{
			run.Strategy, run.Scenario, run.LoopLabel(), strconv.Itoa(run.Limit), strconv.Itoa(run.Workers),
			strconv.Itoa(run.Procs), fmtRate(run.GrantsPerSec), fmtRate(run.NoSlotPerSec), fmtRate(run.GiveUpsPerSec),
			fmtRate(run.ErrorsPerSec), fmtPer(run.ConflictsPerGrant), fmtPer(run.AttemptsPerGrant),
			fmtPer(run.RoundTripsPerGrant), fmtPer(run.CommandsPerGrant), fmtMs(l.P50), fmtMs(l.P90), fmtMs(l.P99), fmtMs(l.P999), fmtMs(l.Max),
			strconv.FormatInt(run.Audit.MaxHolders, 10), audit,
		})
	}
	writeTable(b, head, rows)
	for _, run := range r.Runs {
		if run.FirstError != "" {
			fmt.Fprintf(b, "- %s, %s: first error: %s\n", run.Strategy, cellLabel(run), run.FirstError)
		}
		if run.Counts.Lost > 0 {
			fmt.Fprintf(b, "- %s, %s: %d leases expired while held (raise the ttl): the audit cannot vouch for those slots\n",
				run.Strategy, cellLabel(run), run.Counts.Lost)
		}
	}
}

func writeTable(b *strings.Builder, head []string, rows [][]string) {
	line := func(cells []string) {
		b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
	}
	line(head)
	sep := make([]string, len(head))
	for i := range sep {
		sep[i] = "---"
	}
	line(sep)
	for _, r := range rows {
		line(r)
	}
	b.WriteString("\n")
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}
