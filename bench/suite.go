package bench

import (
	"fmt"
	"slices"
	"time"

	"github.com/credpool/credpool/bench/workload"
)

// Cell is one measured workload, run once per strategy.
type Cell struct {
	// Scenario names the workload in reports.
	Scenario string
	// Spec is the whole workload: Workers, Ops and Rate are totals that the
	// harness splits over Procs processes.
	Spec workload.Spec
	// Procs is the number of OS processes running the callers.
	Procs int
}

// scenarios are the presets a Grid names; a Grid sets the rest of the spec.
var scenarios = map[string]workload.Spec{
	// Many keys, every caller its own four candidates: little contention.
	"uniform": {Keys: 1000, Candidates: 4, Choice: workload.Uniform, Order: workload.Ranked},
	// YCSB's skew: key 0 draws about an eighth of all picks.
	"zipf": {Keys: 1000, Candidates: 4, Choice: workload.Zipf, Order: workload.Ranked},
	// One key for everyone.
	"hot": {Keys: 1, Candidates: 1, Choice: workload.Hot, Order: workload.Ranked},
	// A pool of 8 keys that every caller lists in the same order.
	"identical": {Keys: 8, Candidates: 8, Choice: workload.Uniform, Order: workload.Identical},
}

// scenarioNames lists the presets in report order.
var scenarioNames = []string{"uniform", "zipf", "hot", "identical"}

// Grid is a cross product of cells: every scenario with every workers,
// limit, procs, rate, pause and wait value. Cells with fewer workers than
// processes are left out, as are waiting callers in an open loop; an open
// loop (rate > 0) and waiting callers, which never pause, are one cell
// whatever the pauses.
type Grid struct {
	Scenarios []string
	Workers   []int
	Limits    []int
	Procs     []int
	// Rates are open-loop offered rates (allocations/s over all
	// processes); 0 is a closed loop.
	Rates []float64
	// Keys and Candidates override the scenario's when positive.
	Keys, Candidates int
	// The rest is the same in every cell; see workload.Spec.
	Hold       time.Duration
	HoldDist   workload.HoldDist
	Duration   time.Duration
	Ops        int64
	CrashShare float64
	TTL        time.Duration
	// Pauses are the closed loop's pauses after "no slot" (see
	// workload.Spec.Pause); 0 is none. The pause decides how hard a hot
	// key's callers retry, so a suite covers more than one.
	Pauses []time.Duration
	// Waits are the callers' waits for a slot (see workload.Spec.Wait):
	// 0 is retrying callers, who pause after "no slot"; a positive wait is
	// waiting callers. Empty means retrying callers only.
	Waits []time.Duration
}

// Standard is the closed-loop suite `make bench` runs: four scenarios, 64
// callers, limits 1 and 5, one and four processes, pauses of 1ms and 5ms
// after "no slot", 3s each: 32 cells per strategy (and repetition).
func Standard() Grid {
	return Grid{
		Scenarios: slices.Clone(scenarioNames),
		Workers:   []int{64},
		Limits:    []int{1, 5},
		Procs:     []int{1, 4},
		Rates:     []float64{0},
		Hold:      time.Millisecond,
		HoldDist:  workload.Exponential,
		Duration:  3 * time.Second,
		TTL:       10 * time.Second,
		Pauses:    []time.Duration{time.Millisecond, 5 * time.Millisecond},
	}
}

// Cells expands the grid, scenarios outermost.
func (g Grid) Cells() ([]Cell, error) {
	if len(g.Pauses) == 0 {
		return nil, fmt.Errorf("bench: the grid needs a pause (0 for none)")
	}
	var cells []Cell
	for _, name := range g.Scenarios {
		preset, ok := scenarios[name]
		if !ok {
			return nil, fmt.Errorf("bench: unknown scenario %q (have %v)", name, scenarioNames)
		}
		for _, rate := range g.Rates {
			for _, wait := range g.waits() {
				if rate > 0 && wait > 0 {
					continue
				}
				pauses := g.Pauses
				if rate > 0 || wait > 0 {
					pauses = []time.Duration{0}
				}
				for _, pause := range pauses {
					for _, limit := range g.Limits {
						for _, procs := range g.Procs {
							for _, workers := range g.Workers {
								if procs < 1 || workers < procs {
									continue
								}
								c, err := g.cell(name, preset, rate, wait, pause, limit, procs, workers)
								if err != nil {
									return nil, err
								}
								cells = append(cells, c)
							}
						}
					}
				}
			}
		}
	}
	if len(cells) == 0 {
		return nil, fmt.Errorf("bench: the grid has no cell (workers must be at least procs)")
	}
	return cells, nil
}

// waits are the grid's waits; none is retrying callers only.
func (g Grid) waits() []time.Duration {
	if len(g.Waits) == 0 {
		return []time.Duration{0}
	}
	return g.Waits
}

// cell is one point of the grid: preset with the grid's settings.
func (g Grid) cell(name string, preset workload.Spec, rate float64, wait, pause time.Duration, limit, procs, workers int) (Cell, error) {
	if g.Ops > 0 && g.Ops < int64(procs) {
		return Cell{}, fmt.Errorf("bench: ops %d cannot be split over %d processes", g.Ops, procs)
	}
	spec := preset
	if g.Keys > 0 {
		spec.Keys = g.Keys
	}
	if g.Candidates > 0 {
		spec.Candidates = g.Candidates
	}
	spec.Candidates = min(spec.Candidates, spec.Keys)
	spec.Limit, spec.Workers, spec.Rate = limit, workers, rate
	spec.Hold, spec.HoldDist, spec.Duration, spec.Ops = g.Hold, g.HoldDist, g.Duration, g.Ops
	spec.CrashShare, spec.TTL, spec.Pause, spec.Wait = g.CrashShare, g.TTL, pause, wait
	if err := spec.Validate(); err != nil {
		return Cell{}, fmt.Errorf("bench: scenario %s: %w", name, err)
	}
	return Cell{Scenario: name, Spec: spec, Procs: procs}, nil
}

// share is process p's part of a cell's spec when it runs in procs
// processes: callers, calls and rate split as evenly as they go.
func share(spec workload.Spec, procs, p int) workload.Spec {
	spec.Workers = spec.Workers/procs + boolInt(p < spec.Workers%procs)
	if spec.Ops > 0 {
		spec.Ops = spec.Ops/int64(procs) + int64(boolInt(int64(p) < spec.Ops%int64(procs)))
	}
	spec.Rate /= float64(procs)
	return spec
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
