package report

import (
	"fmt"
	"slices"
	"strconv"
)

// The ratio column compares these two strategies.
const (
	RatioNum = "optimistic"
	RatioDen = "lua"
)

// row is one cell with its runs by strategy.
type row struct {
	cell Run // the first run, for the cell's fields
	by   map[string]*Run
}

// cellKey identifies a cell whatever the strategy.
func cellKey(r Run) string {
	return fmt.Sprintf("%s|%s|%g|%d|%d|%d|%d|%d|%s|%s|%s|%d|%g",
		r.Scenario, r.Loop, r.Rate, r.Keys, r.Limit, r.Candidates, r.Workers, r.Procs,
		r.Hold, r.HoldDist, r.Duration, r.Ops, r.CrashShare)
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
			rows = append(rows, row{cell: *run, by: map[string]*Run{}})
		}
		rows[j].by[run.Strategy] = run
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

// hasRatio says whether both strategies of the ratio column ran.
func (r *Report) hasRatio() bool {
	s := r.strategies()
	return slices.Contains(s, RatioNum) && slices.Contains(s, RatioDen)
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

// LoopLabel names a run's loop: "closed" or "open 2000/s".
func (r Run) LoopLabel() string {
	if r.Loop == "open" {
		return "open " + strconv.FormatFloat(r.Rate, 'f', -1, 64) + "/s"
	}
	return r.Loop
}

// fmtRate formats an events-per-second figure.
func fmtRate(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }

// fmtPer formats a per-grant figure; nil is "n/a".
func fmtPer(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return strconv.FormatFloat(*v, 'f', 2, 64)
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
