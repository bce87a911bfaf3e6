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
// limit, procs and rate value. Cells with fewer workers than processes are
// left out.
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
	Pause      time.Duration
}

// Standard is the suite `make bench` runs: four scenarios, 1, 8 and 64
// callers, limits 1 and 5, one and two processes, a second each: 40 cells
// per strategy.
func Standard() Grid {
	return Grid{
		Scenarios: slices.Clone(scenarioNames),
		Workers:   []int{1, 8, 64},
		Limits:    []int{1, 5},
		Procs:     []int{1, 2},
		Rates:     []float64{0},
		Hold:      time.Millisecond,
		HoldDist:  workload.Exponential,
		Duration:  time.Second,
		TTL:       10 * time.Second,
		Pause:     time.Millisecond,
	}
}

// Cells expands the grid, scenarios outermost.
func (g Grid) Cells() ([]Cell, error) {
	var cells []Cell
	for _, name := range g.Scenarios {
		preset, ok := scenarios[name]
		if !ok {
			return nil, fmt.Errorf("bench: unknown scenario %q (have %v)", name, scenarioNames)
		}
		for _, rate := range g.Rates {
			for _, limit := range g.Limits {
				for _, procs := range g.Procs {
					for _, workers := range g.Workers {
						if procs < 1 || workers < procs {
							continue
						}
						if g.Ops > 0 && g.Ops < int64(procs) {
							return nil, fmt.Errorf("bench: ops %d cannot be split over %d processes", g.Ops, procs)
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
						spec.CrashShare, spec.TTL, spec.Pause = g.CrashShare, g.TTL, g.Pause
						if err := spec.Validate(); err != nil {
							return nil, fmt.Errorf("bench: scenario %s: %w", name, err)
						}
						cells = append(cells, Cell{Scenario: name, Spec: spec, Procs: procs})
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
