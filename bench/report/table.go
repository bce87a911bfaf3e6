package report

import (
	"fmt"
	"math"
	"slices"
	"strconv"
)

// Pair is a ratio column: the median of Num's figure over Den's.
type Pair struct{ Num, Den string }

// Pairs are the ratio columns, each shown when both of its strategies ran.
// Both of a pair have the same admission control, the per-key gate or
// none, so that a ratio compares the stores' transactions alone.
func Pairs() []Pair {
	return []Pair{{"optimistic", "lua+gate"}, {"optimistic-nogate", "lua"}}
}

// row is one cell with its runs by strategy, in repetition order.
type row struct {
	cell Run // the first run, for the cell's fields
	by   map[string][]*Run
}

// cellKey identifies a cell whatever the strategy and repetition.
func cellKey(r Run) string {
	return fmt.Sprintf("%s|%s|%g|%d|%d|%d|%d|%d|%s|%s|%s|%d|%g|%s|%s",
		r.Scenario, r.Loop, r.Rate, r.Keys, r.Limit, r.Candidates, r.Workers, r.Procs,
		r.Hold, r.HoldDist, r.Duration, r.Ops, r.CrashShare, r.Pause, r.Wait)
}

// callersKey identifies a cell whatever its callers do after "no slot",
// pause or wait in line: retrying and waiting callers of one workload
// share it.
func callersKey(r Run) string {
	r.Pause, r.Wait = "", ""
	return cellKey(r)
}

// rows groups runs by cell, in the order cells first ran.
func (r *Report) rows() []row {
	var rows []row
	index := map[string]int{}
	for i := range r.Runs {
		run := &r.Runs[i]
		k := cellKey(*run)
		j, ok := index[k]
		if !ok {
			j = len(rows)
			index[k] = j
			rows = append(rows, row{cell: *run, by: map[string][]*Run{}})
		}
		rows[j].by[run.Strategy] = append(rows[j].by[run.Strategy], run)
	}
	return rows
}

// strategies are the report's strategies in order: Env's list, then any
// other that ran.
func (r *Report) strategies() []string {
	names := slices.Clone(r.Env.Strategies)
	for _, run := range r.Runs {
		if !slices.Contains(names, run.Strategy) {
			names = append(names, run.Strategy)
		}
	}
	return names
}

// pairs are the ratio columns whose strategies both ran.
func (r *Report) pairs() []Pair {
	s := r.strategies()
	return slices.DeleteFunc(Pairs(), func(p Pair) bool { return !slices.Contains(s, p.Num) || !slices.Contains(s, p.Den) })
}

// spreadOf is get over the runs that have a value, and how many have.
func spreadOf(runs []*Run, get func(*Run) (float64, bool)) (Spread, int) {
	var vs []float64
	for _, run := range runs {
		if v, ok := get(run); ok {
			vs = append(vs, v)
		}
	}
	return SpreadOf(vs), len(vs)
}

// formatSpread is the median of n values and, over several, their range:
// "–" for none. When only n of the cell's of runs had one (a run without
// a grant has no per-grant figure), it says so, so that a figure of some
// runs does not pass for the cell's.
func formatSpread(s Spread, n, of int, f func(float64) string) string {
	switch n {
	case 0:
		return "–"
	case 1:
		return f(s.Median) + partial(n, of)
	}
	return spread(s, f) + partial(n, of)
}

// formatMedian is the median of n values, "–" for none.
func formatMedian(s Spread, n int, f func(float64) string) string {
	if n == 0 {
		return "–"
	}
	return f(s.Median)
}

// partial marks a figure of n of a cell's of runs, when that is some but
// not all.
func partial(n, of int) string {
	if n > 0 && n < of {
		return fmt.Sprintf(" (%d of %d runs)", n, of)
	}
	return ""
}

// Ratio formats num/den as "0.52×"; "n/a" when den is zero, since a ratio
// to nothing says nothing.
func Ratio(num, den float64) string {
	if den == 0 {
		return "n/a"
	}
	v := num / den
	switch {
	case v == 0:
		return "0×"
	case v < 0.01:
		return strconv.FormatFloat(v, 'f', 4, 64) + "×"
	case v < 10:
		return strconv.FormatFloat(v, 'f', 2, 64) + "×"
	default:
		return strconv.FormatFloat(v, 'f', 0, 64) + "×"
	}
}

// LoopLabel names a run's loop: "closed", "closed, wait 10s" (waiting
// callers) or "open 2000/s".
func (r Run) LoopLabel() string {
	switch {
	case r.Loop == "open":
		return "open " + strconv.FormatFloat(r.Rate, 'f', -1, 64) + "/s"
	case r.Wait != "":
		return r.Loop + ", wait " + r.Wait
	}
	return r.Loop
}

// pauseLabel is the closed loop's pause; "–" for an open loop and for
// waiting callers, which never pause.
func (r Run) pauseLabel() string {
	if r.Loop == "open" || r.Wait != "" {
		return "–"
	}
	return r.Pause
}

// FormatMaxOverMin formats a run's max/min grants per caller: "∞ (3
// starved)" when callers got no grant, "n/a" without callers.
func FormatMaxOverMin(f Fairness) string {
	switch {
	case f.MaxOverMin != nil:
		return fmtFloat(*f.MaxOverMin)
	case f.Callers == 0:
		return "n/a"
	}
	return fmt.Sprintf("∞ (%d starved)", f.Starved)
}

// fmtFair formats a max/min ratio that may be infinite.
func fmtFair(v float64) string {
	if math.IsInf(v, 1) {
		return "∞"
	}
	return fmtFloat(v)
}

// fmtFloat formats a per-grant figure.
func fmtFloat(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

// fmtRate formats an events-per-second figure.
func fmtRate(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }

// fmtPer formats a per-grant figure; nil is "n/a".
func fmtPer(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return fmtFloat(*v)
}

// fmtMicros formats whole microseconds, "n/a" for nil.
func fmtMicros(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return fmtRate(*v)
}

// fmtMs formats milliseconds with three significant digits or so.
func fmtMs(v float64) string {
	switch {
	case v < 10:
		return strconv.FormatFloat(v, 'f', 2, 64)
	case v < 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
}
