package report

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// chartMetric is one quantity plotted against worker count.
type chartMetric struct {
	file  string // file name suffix
	label string // y axis
	value func(*Run) (float64, bool)
}

var chartMetrics = []chartMetric{
	{"goodput", "grants/s", func(r *Run) (float64, bool) { return r.GrantsPerSec, true }},
	{"conflicts", "conflicts per grant", func(r *Run) (float64, bool) {
		if r.ConflictsPerGrant == nil {
			return 0, false
		}
		return *r.ConflictsPerGrant, true
	}},
	{"p99", "p99 per-call latency, granted (ms)", callP99.get},
	{"ttg-p99", "p99 time to grant (ms)", waitedP99.get},
}

// Tile size of one limit/procs combination.
const (
	tileWidth  = 3.4 * vg.Inch
	tileHeight = 2.6 * vg.Inch
)

// WritePlots writes, for every scenario, loop and pause, one PNG per
// metric (goodput, conflicts per grant, p99 per-call latency, p99 time to
// grant) against worker count: one tile per limit (rows) and process
// count (columns), one line per strategy through the medians of the
// repetitions. It returns the paths written.
func (r *Report) WritePlots(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	var written []string
	for _, g := range r.chartGroups() {
		for _, m := range chartMetrics {
			path := filepath.Join(dir, g.name+"-"+m.file+".png")
			if err := r.writeChart(path, g, m); err != nil {
				return written, err
			}
			written = append(written, path)
		}
	}
	return written, nil
}

// chartGroup is the runs of one scenario, loop and pause (or wait).
type chartGroup struct {
	name                   string
	scenario               string
	loop                   string // with the pause of a closed loop
	limits, procs, workers []int
	runs                   []*Run
}

func (r *Report) chartGroups() []*chartGroup {
	var groups []*chartGroup
	for i := range r.Runs {
		run := &r.Runs[i]
		name, loop := run.Scenario+"-"+run.Loop, run.LoopLabel()
		switch {
		case run.Loop == "open":
			name += "-" + strconv.FormatFloat(run.Rate, 'f', -1, 64)
		case run.Wait != "":
			name += "-wait-" + run.Wait
		default:
			name += "-" + run.Pause
			loop += " pause " + run.Pause
		}
		j := slices.IndexFunc(groups, func(g *chartGroup) bool { return g.name == name })
		if j < 0 {
			j = len(groups)
			groups = append(groups, &chartGroup{name: name, scenario: run.Scenario, loop: loop})
		}
		g := groups[j]
		if !slices.Contains(g.limits, run.Limit) {
			g.limits = append(g.limits, run.Limit)
		}
		if !slices.Contains(g.procs, run.Procs) {
			g.procs = append(g.procs, run.Procs)
		}
		if !slices.Contains(g.workers, run.Workers) {
			g.workers = append(g.workers, run.Workers)
		}
		g.runs = append(g.runs, run)
	}
	return groups
}

func (r *Report) writeChart(path string, g *chartGroup, m chartMetric) error {
	plots := make([][]*plot.Plot, len(g.limits))
	for i, limit := range g.limits {
		plots[i] = make([]*plot.Plot, len(g.procs))
		for j, procs := range g.procs {
			p, err := r.tile(g, m, limit, procs)
			if err != nil {
				return err
			}
			plots[i][j] = p
		}
	}
	img := vgimg.New(vg.Length(len(g.procs))*tileWidth, vg.Length(len(g.limits))*tileHeight)
	dc := draw.New(img)
	tiles := draw.Tiles{
		Rows: len(g.limits), Cols: len(g.procs),
		PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2,
	}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		for j := range plots[i] {
			plots[i][j].Draw(canvases[i][j])
		}
	}
	return writeFile(path, func(w io.Writer) error {
		_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
		return err
	})
}

// tile plots one limit and process count: x workers (log scale, the same
// range in every tile of the group), one line per strategy.
func (r *Report) tile(g *chartGroup, m chartMetric, limit, procs int) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s, %s: limit %d, %d %s", g.scenario, g.loop, limit, procs, plural(procs, "process", "processes"))
	p.X.Label.Text = "workers"
	p.Y.Label.Text = m.label
	p.Y.Min = 0
	p.Legend.Top = true
	// Half a step of margin on either side keeps points off the frame.
	p.X.Scale = plot.LogScale{}
	p.X.Min, p.X.Max = float64(slices.Min(g.workers))/1.5, float64(slices.Max(g.workers))*1.5
	ticks := make([]plot.Tick, len(g.workers))
	for i, w := range g.workers {
		ticks[i] = plot.Tick{Value: float64(w), Label: strconv.Itoa(w)}
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	for i, name := range r.strategies() {
		var pts plotter.XYs
		for _, w := range g.workers {
			var reps []*Run
			for _, run := range g.runs {
				if run.Strategy == name && run.Limit == limit && run.Procs == procs && run.Workers == w {
					reps = append(reps, run)
				}
			}
			if sp, n := spreadOf(reps, m.value); n > 0 {
				pts = append(pts, plotter.XY{X: float64(w), Y: sp.Median})
			}
		}
		if len(pts) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, fmt.Errorf("report: plot %s: %w", name, err)
		}
		line.Color = plotutil.Color(i)
		points.Color = plotutil.Color(i)
		points.Shape = plotutil.Shape(i)
		p.Add(line, points)
		p.Legend.Add(name, line, points)
	}
	// Headroom for the legend; an empty or all-zero tile still gets an axis.
	if p.Y.Max > 0 {
		p.Y.Max *= 1.3
	} else {
		p.Y.Max = 1
	}
	return p, nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
