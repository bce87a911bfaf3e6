package report

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// WriteMarkdown writes the machine, the audit verdict, tables with the
// strategies side by side (medians and range over the repetitions, and
// the ratios of the Pairs whose strategies both ran) and a table of every
// metric of every run.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	r.markdownEnv(&b)
	r.markdownAudit(&b)
	r.markdownSkipped(&b)
	r.markdownSideBySide(&b)
	r.markdownWaiting(&b)
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
			"(harness count at every grant) and none had more live leases than its limit in the store afterwards", len(r.Runs))
		sampled, samples := 0, 0
		for _, run := range r.Runs {
			if run.Audit.Samples > 0 {
				sampled++
				samples += run.Audit.Samples
			}
		}
		if sampled > 0 {
			fmt.Fprintf(b, ", nor, in the %d runs whose callers held for zero, in the %d reads of the store's state "+
				"every 20 ms during the run", sampled, samples)
		}
		b.WriteString(".\n\n")
		return
	}
	b.WriteString("**Oversell audit: FAILED.**\n\n")
	for _, run := range r.Runs {
		if !run.Audit.OK() {
			fmt.Fprintf(b, "- %s, %s: %d holder violations (max %d holders, limit %d), %d times a key over its limit in the store; first: %s\n",
				run.Strategy, cellLabel(run), run.Audit.HolderViolations, run.Audit.MaxHolders, run.Limit,
				run.Audit.StateViolations, run.Audit.First)
		}
	}
	b.WriteString("\n")
}

func (r *Report) markdownSkipped(b *strings.Builder) {
	for _, s := range r.Skipped {
		fmt.Fprintf(b, "**Skipped:** %s in %d %s (%s).\n\n", s.Strategy, s.Runs, plural(s.Runs, "run", "runs"), s.Reason)
	}
}

// markdownWaiting puts retrying and waiting callers of each workload side
// by side, per strategy: one row per retrying cell (pause) that has a
// waiting twin.
func (r *Report) markdownWaiting(b *strings.Builder) {
	rows := r.rows()
	if !slices.ContainsFunc(rows, func(rw row) bool { return rw.cell.Wait != "" }) {
		return
	}
	b.WriteString("## Retrying vs waiting callers\n\n")
	b.WriteString("The same workload and strategy with retrying callers (a pause, ±50%, after each \"no slot\") " +
		"and with waiting callers (AllocateRequest.Wait: in line for a slot, woken when one frees, never pausing). " +
		"Figures are medians over the repetitions, retrying / waiting. Time to grant runs from a caller's first call " +
		"for a grant to the grant, \"no slot\" answers, pauses and time in line included. Requests per grant are every " +
		"request sent to Redis (each command, pipeline or MULTI…EXEC once, the SPUBLISH of a release riding in its " +
		"round trip, after its MULTI…EXEC; plus the SSUBSCRIBE/SUNSUBSCRIBE of the pub/sub connections), releases included, over the grants. " +
		"Max/min is the most grants of one caller over the fewest: ∞ when a caller got none.\n\n")
	head := []string{"strategy", "scenario", "limit", "workers", "procs", "pause", "wait",
		"time to grant p99 (ms)", "retry/wait", "grants/s", "wait/retry", "requests/grant", "max/min grants per caller"}
	var out [][]string
	for _, name := range r.strategies() {
		for _, w := range rows {
			waiting := w.by[name]
			if w.cell.Wait == "" || len(waiting) == 0 {
				continue
			}
			var twins []row
			for _, rt := range rows {
				if rt.cell.Wait == "" && callersKey(rt.cell) == callersKey(w.cell) && len(rt.by[name]) > 0 {
					twins = append(twins, rt)
				}
			}
			if len(twins) == 0 {
				twins = []row{{cell: Run{Pause: "–"}}}
			}
			for _, rt := range twins {
				retrying, c := rt.by[name], w.cell
				out = append(out, []string{
					name, c.Scenario, strconv.Itoa(c.Limit), strconv.Itoa(c.Workers), strconv.Itoa(c.Procs), rt.cell.Pause, c.Wait,
					medians(retrying, waiting, waitedP99), ratioOf(retrying, waiting, waitedP99),
					medians(retrying, waiting, grantsPerSec), ratioOf(waiting, retrying, grantsPerSec),
					medians(retrying, waiting, requests), medians(retrying, waiting, maxOverMin),
				})
			}
		}
	}
	writeTable(b, head, out)
}

// medians is "a / b": the medians of m over runs a and b.
func medians(a, b []*Run, m metric) string {
	sa, ka := spreadOf(a, m.get)
	sb, kb := spreadOf(b, m.get)
	return formatMedian(sa, ka, m.format) + partial(ka, len(a)) + " / " + formatMedian(sb, kb, m.format) + partial(kb, len(b))
}

// ratioOf is the ratio of the medians of m over runs num and den.
func ratioOf(num, den []*Run, m metric) string {
	sn, kn := spreadOf(num, m.get)
	sd, kd := spreadOf(den, m.get)
	if kn == 0 || kd == 0 {
		return "–"
	}
	return Ratio(sn.Median, sd.Median) + partialRatio(kn < len(num) || kd < len(den))
}

// partialRatio marks a ratio of medians one of which is not of every run.
func partialRatio(partial bool) string {
	if partial {
		return " (not of every run)"
	}
	return ""
}

// cellLabel describes a cell in one phrase.
func cellLabel(r Run) string {
	return fmt.Sprintf("%s %s limit %d, %d workers, %d procs", r.Scenario, r.LoopLabel(), r.Limit, r.Workers, r.Procs)
}

// metric is one figure of a run; ok is false where the run has none.
type metric struct {
	get    func(*Run) (v float64, ok bool)
	format func(float64) string
}

var (
	grantsPerSec = metric{func(r *Run) (float64, bool) { return r.GrantsPerSec, true }, fmtRate}
	waitedP50    = metric{func(r *Run) (float64, bool) { return r.TimeToGrant.P50, r.waited() }, fmtMs}
	waitedP99    = metric{func(r *Run) (float64, bool) { return r.TimeToGrant.P99, r.waited() }, fmtMs}
	waitedMax    = metric{func(r *Run) (float64, bool) { return r.TimeToGrant.Max, r.waited() }, fmtMs}
	callP50      = metric{func(r *Run) (float64, bool) { return r.GrantLatency.P50, r.Counts.Grants > 0 }, fmtMs}
	callP99      = metric{func(r *Run) (float64, bool) { return r.GrantLatency.P99, r.Counts.Grants > 0 }, fmtMs}
	callMax      = metric{func(r *Run) (float64, bool) { return r.GrantLatency.Max, r.Counts.Grants > 0 }, fmtMs}
	conflicts    = metric{func(r *Run) (float64, bool) { return deref(r.ConflictsPerGrant) }, fmtFloat}
	roundTrips   = metric{func(r *Run) (float64, bool) { return deref(r.RoundTripsPerGrant) }, fmtFloat}
	requests     = metric{func(r *Run) (float64, bool) { return deref(r.RequestsPerGrant) }, fmtFloat}
	// maxOverMin is infinite where a caller got no grant.
	maxOverMin = metric{func(r *Run) (float64, bool) {
		if r.Fairness.MaxOverMin == nil {
			return math.Inf(1), r.Fairness.Callers > 0
		}
		return *r.Fairness.MaxOverMin, true
	}, fmtFair}
)

// waited says whether a time to grant was measured: a grant, or a caller
// left waiting.
func (r *Run) waited() bool { return r.Counts.Grants+r.Counts.Waiting > 0 }

func deref(v *float64) (float64, bool) {
	if v == nil {
		return 0, false
	}
	return *v, true
}

// column is one column of a side-by-side table.
type column struct {
	head  string
	value func(row) string
}

// bySpread is a column per strategy: the median of m over the cell's
// repetitions, with their range.
func (r *Report) bySpread(prefix string, m metric) []column {
	var cols []column
	for _, n := range r.strategies() {
		cols = append(cols, column{head: prefix + n, value: func(rw row) string {
			sp, k := spreadOf(rw.by[n], m.get)
			return formatSpread(sp, k, len(rw.by[n]), m.format)
		}})
	}
	return cols
}

// byMedians is a column per strategy: the medians of ms, joined by " / ".
func (r *Report) byMedians(prefix string, ms ...metric) []column {
	var cols []column
	for _, n := range r.strategies() {
		cols = append(cols, column{head: prefix + n, value: func(rw row) string {
			runs := rw.by[n]
			parts := make([]string, len(ms))
			fewest := len(runs)
			for i, m := range ms {
				sp, k := spreadOf(runs, m.get)
				parts[i] = formatMedian(sp, k, m.format)
				if k > 0 {
					fewest = min(fewest, k)
				}
			}
			return strings.Join(parts, " / ") + partial(fewest, len(runs))
		}})
	}
	return cols
}

// ratios is a column per pair: the ratio of its strategies' medians of m.
func (r *Report) ratios(m metric) []column {
	var cols []column
	for _, p := range r.pairs() {
		cols = append(cols, column{head: p.Num + "/" + p.Den, value: func(rw row) string {
			return ratioOf(rw.by[p.Num], rw.by[p.Den], m)
		}})
	}
	return cols
}

// reps is the most repetitions any cell had.
func (r *Report) reps() int {
	n := 1
	for _, run := range r.Runs {
		n = max(n, run.Rep)
	}
	return n
}

func (r *Report) markdownSideBySide(b *strings.Builder) {
	b.WriteString("## Side by side\n\n")
	if n := r.reps(); n > 1 {
		fmt.Fprintf(b, "Every cell ran %d times, the strategies in turn in one order, then the reverse, alternately (every other cell starting with the reverse); "+
			"a figure is the median of the repetitions, with their range (min–max) in brackets.", n)
	} else {
		b.WriteString("Every cell ran once: a figure is that run's, with no spread to judge its noise by.")
	}
	b.WriteString(" Pause is the closed loop's pause (±50%) after \"no slot\".")
	if ps := r.pairs(); len(ps) > 0 {
		b.WriteString(" The ratio columns divide the medians of two strategies with the same admission control " +
			"(the per-key gate in each process, or none): ")
		for i, p := range ps {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(b, "%s / %s", p.Num, p.Den)
		}
		b.WriteString(".")
	}
	b.WriteString("\n\n")
	r.sideTable(b, "Grants per second", "", append(r.bySpread("", grantsPerSec), r.ratios(grantsPerSec)...))
	r.sideTable(b, "Time to grant, p99 (ms)",
		"From the start of a caller's first call for a grant to the grant: the calls that found no slot "+
			"and the pauses after them count; callers left waiting at the end count with their wait so far.",
		append(r.bySpread("", waitedP99), r.ratios(waitedP99)...))
	r.sideTable(b, "Per-call latency of granted calls, p99 (ms)",
		"Each call on its own: what the calls that found no slot cost their callers is not in it.",
		append(r.bySpread("", callP99), r.ratios(callP99)...))
	r.sideTable(b, "Latency p50 / p99 / max (ms), medians", "",
		append(r.byMedians("time to grant ", waitedP50, waitedP99, waitedMax), r.byMedians("per call ", callP50, callP99, callMax)...))
	r.sideTable(b, "EXEC conflicts and Redis round trips per grant", "",
		append(r.bySpread("conflicts ", conflicts), r.bySpread("round trips ", roundTrips)...))
}

// sideTable writes one table of the cells: the cell's fields, then cols.
func (r *Report) sideTable(b *strings.Builder, title, note string, cols []column) {
	fmt.Fprintf(b, "### %s\n\n", title)
	if note != "" {
		b.WriteString(note + "\n\n")
	}
	head := []string{"scenario", "loop", "pause", "limit", "workers", "procs"}
	for _, c := range cols {
		head = append(head, c.head)
	}
	var rows [][]string
	for _, rw := range r.rows() {
		c := rw.cell
		cells := []string{c.Scenario, c.LoopLabel(), c.pauseLabel(), strconv.Itoa(c.Limit), strconv.Itoa(c.Workers), strconv.Itoa(c.Procs)}
		for _, col := range cols {
			cells = append(cells, col.value(rw))
		}
		rows = append(rows, cells)
	}
	writeTable(b, head, rows)
}

func (r *Report) markdownAll(b *strings.Builder) {
	b.WriteString("## Every metric\n\n")
	b.WriteString("Rates are per second of the run; latencies (ms) are of granted allocations, from the intended start " +
		"in an open loop; ttg is the time to grant (see above) and waiting the callers it found without one at the end; conflicts are aborted EXECs (SQLite: busy retries); attempts are candidate reads " +
		"(SQLite: transactions); round trips are requests the clients sent (a pipeline or MULTI…EXEC is one); " +
		"requests add the pub/sub subscription commands (see above) to them; " +
		"commands are what the server ran by INFO commandstats, commands inside Lua scripts included, " +
		"connection set-up left out. Per-grant figures count releases too. Max/min is the most grants of one " +
		"caller over the fewest, with the callers that got none. Hold +µs is by how much a hold ran past its " +
		"time on average: the harness's clock and scheduling, part of every grant's cycle.\n\n")
	head := []string{"strategy", "rep", "scenario", "loop", "pause", "limit", "workers", "procs", "grants/s", "no-slot/s",
		"give-ups/s", "errors/s", "conflicts/grant", "attempts/grant", "round trips/grant", "requests/grant", "cmds/grant", "p50", "p90", "p99",
		"p99.9", "max", "ttg p50", "ttg p99", "ttg max", "waiting", "max/min grants", "hold +µs", "max holders", "audit"}
	var rows [][]string
	for _, run := range r.Runs {
		audit := "ok"
		if !run.Audit.OK() {
			audit = fmt.Sprintf("**FAILED** (%d+%d)", run.Audit.HolderViolations, run.Audit.StateViolations)
		}
		l, w := run.GrantLatency, run.TimeToGrant
		rows = append(rows, []string{
			run.Strategy, strconv.Itoa(run.Rep), run.Scenario, run.LoopLabel(), run.pauseLabel(), strconv.Itoa(run.Limit),
			strconv.Itoa(run.Workers), strconv.Itoa(run.Procs), fmtRate(run.GrantsPerSec), fmtRate(run.NoSlotPerSec),
			fmtRate(run.GiveUpsPerSec), fmtRate(run.ErrorsPerSec), fmtPer(run.ConflictsPerGrant), fmtPer(run.AttemptsPerGrant),
			fmtPer(run.RoundTripsPerGrant), fmtPer(run.RequestsPerGrant), fmtPer(run.CommandsPerGrant),
			fmtMs(l.P50), fmtMs(l.P90), fmtMs(l.P99), fmtMs(l.P999), fmtMs(l.Max),
			fmtMs(w.P50), fmtMs(w.P99), fmtMs(w.Max), strconv.FormatInt(run.Counts.Waiting, 10),
			FormatMaxOverMin(run.Fairness), fmtMicros(run.HoldExcessMicros), strconv.FormatInt(run.Audit.MaxHolders, 10), audit,
		})
	}
	writeTable(b, head, rows)
	for _, run := range r.Runs {
		if run.FirstError != "" {
			fmt.Fprintf(b, "- %s, %s: first error: %s\n", run.Strategy, cellLabel(run), run.FirstError)
		}
		if run.Counts.Offered > run.Counts.Calls {
			fmt.Fprintf(b, "- %s, %s: made %d of the %d calls offered: the store fell behind, and the latencies are of the calls made only\n",
				run.Strategy, cellLabel(run), run.Counts.Calls, run.Counts.Offered)
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
