package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/credpool/credpool/bench/report"
	"github.com/credpool/credpool/bench/workload"
)

const (
	// cleanupTimeout bounds removing a run's keys from the service after
	// the measurements, also after ctx ended.
	cleanupTimeout = 30 * time.Second
	// serviceWarmUp is how long the service runs unmeasured before a
	// cell's repetitions, so the first is not the only one to meet cold
	// caches and a small heap.
	serviceWarmUp = 500 * time.Millisecond
)

// ServiceConfig is one service benchmark: credpool serve, run as its own
// process and driven over HTTP, against its lease store alone under the
// harness, cell by cell in the same run.
type ServiceConfig struct {
	// Strategies are the lease stores to run the service on, in this
	// order; each is measured alone too. See ServiceStrategies.
	Strategies []Strategy
	// Keys is the number of keys, all in one provider, pool and model.
	Keys int
	// Every cell is one limit (every key's max_concurrent_uses) with one
	// number of concurrent callers.
	Limits, Workers []int
	// Duration is the length of each run, of the service and of the store.
	Duration time.Duration
	// Reps is how many times each cell runs, the service first in odd
	// repetitions and the store first in even ones.
	Reps int
	// TTL is the lease length, in whole seconds (lease_seconds); it must
	// outlast any cycle by far.
	TTL time.Duration
	// Pause is how long a caller waits (±50%) after an answer other than a
	// grant (or a failed report) before it asks again.
	Pause time.Duration
	// RedisURL is the server of a Redis strategy, used by the service and
	// the store alone. Empty starts a throwaway redis-server on loopback.
	RedisURL string
	// AllowRemote permits a RedisURL that is not on loopback.
	AllowRemote bool
	// OutDir receives results.json and summary.md. Empty writes no files.
	OutDir string
	// Seed makes the callers' choices reproducible.
	Seed uint64
	// Serve is the command line of "credpool serve", to which the harness
	// adds --listen and --db. ServeEnv is added to its environment, which
	// keeps none of this process's CREDPOOL_ variables.
	Serve    []string
	ServeEnv []string
	// Args is the command line the report records.
	Args []string
	// Stdout receives the Markdown report and Progress the progress; nil
	// discards either.
	Stdout, Progress io.Writer
}

// ServiceStrategies returns the lease stores credpool serve runs on, in
// report order: "sqlite" (no --redis: leases in the catalog's file) and
// "optimistic" (--redis: WATCH/MULTI).
func ServiceStrategies() []Strategy {
	return slices.DeleteFunc(Strategies(), func(s Strategy) bool { return s.Name != "sqlite" && s.Name != "optimistic" })
}

// Validate returns an error naming the first field out of range; it does
// not look at Serve.
func (cfg ServiceConfig) Validate() error {
	switch {
	case len(cfg.Strategies) == 0:
		return errors.New("bench: service: no lease store to run on")
	case cfg.Keys < 1:
		return errors.New("bench: service: keys must be at least 1")
	case len(cfg.Limits) == 0 || slices.Min(cfg.Limits) < 1:
		return errors.New("bench: service: limits must be at least 1")
	case len(cfg.Workers) == 0 || slices.Min(cfg.Workers) < 1:
		return errors.New("bench: service: workers must be at least 1")
	case cfg.Duration <= 0:
		return errors.New("bench: service: duration must be positive")
	case cfg.Reps < 1:
		return errors.New("bench: service: reps must be at least 1")
	case cfg.TTL < time.Second || cfg.TTL%time.Second != 0:
		return fmt.Errorf("bench: service: ttl %v: the service takes whole seconds (lease_seconds), at least 1s", cfg.TTL)
	case cfg.Pause < 0:
		return errors.New("bench: service: pause must not be negative")
	}
	for _, s := range cfg.Strategies {
		if !slices.ContainsFunc(ServiceStrategies(), func(t Strategy) bool { return t.Name == s.Name }) {
			return fmt.Errorf("bench: service: credpool serve has no %s lease store (have %s)", s.Name, strategyNames(ServiceStrategies()))
		}
	}
	return nil
}

// RunService measures every cell on every strategy: it starts credpool
// serve on the strategy's store, loads the keys through the admin API,
// runs the service unmeasured for a moment, and in each repetition runs the service's closed loop (allocate, then report
// success, which releases) and the store's alone (Allocate, then Release
// at once) with the same keys, limit and callers. Then it stops the
// service, removes everything it started or wrote but the reports, and
// writes those. It returns an error wrapping ErrOversold, with the report,
// if an oversell audit failed; other errors stop it at once.
func RunService(ctx context.Context, cfg ServiceConfig) (*report.ServiceReport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(cfg.Serve) == 0 {
		return nil, errors.New("bench: service: no command line for credpool serve")
	}
	rep := &report.ServiceReport{}
	h, done, err := newHarness(ctx, &Config{
		Strategies: cfg.Strategies, RedisURL: cfg.RedisURL, AllowRemote: cfg.AllowRemote, Seed: cfg.Seed, Args: cfg.Args,
	}, &rep.Env)
	if err != nil {
		return nil, err
	}
	defer done()

	prog := newProgress(cfg.Progress, 2*cfg.Reps*len(cfg.Strategies)*len(cfg.Limits)*len(cfg.Workers))
	for _, s := range cfg.Strategies {
		cells, err := serviceCells(ctx, cfg, h, s, prog)
		rep.Cells = append(rep.Cells, cells...)
		if err != nil {
			prog.close()
			return rep, err
		}
	}
	prog.close()
	if cfg.Stdout != nil {
		if err := rep.WriteMarkdown(cfg.Stdout); err != nil {
			return rep, err
		}
	}
	if cfg.OutDir != "" {
		if _, err := rep.WriteFiles(cfg.OutDir); err != nil {
			return rep, err
		}
	}
	if rep.Failed() {
		return rep, fmt.Errorf("%w: see the report", ErrOversold)
	}
	return rep, nil
}

// serviceCells runs every cell of one strategy on one credpool serve
// process, which it stops at the end.
func serviceCells(ctx context.Context, cfg ServiceConfig, h *harness, s Strategy, prog *progress) (_ []report.ServiceCell, err error) {
	var redisURL string
	if s.Redis {
		redisURL = h.redis.url
	}
	svc, err := startService(ctx, cfg.Serve, cfg.ServeEnv, redisURL, slices.Max(cfg.Workers))
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, svc.stop()) }()
	// Ids of this run alone: a Redis the harness did not start may hold
	// another service's keys.
	ids := make([]string, cfg.Keys)
	for i := range ids {
		ids[i] = fmt.Sprintf("bench-%d-%d", h.id, i)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		err = errors.Join(err, svc.deleteKeys(cctx, ids))
	}()
	var cells []report.ServiceCell
	for _, limit := range cfg.Limits {
		for _, workers := range cfg.Workers {
			spec := workload.Spec{
				Keys: cfg.Keys, Limit: limit, Candidates: cfg.Keys, Choice: workload.Uniform, Order: workload.Ranked,
				Workers: workers, HoldDist: workload.Fixed, Duration: cfg.Duration, TTL: cfg.TTL, Pause: cfg.Pause,
			}
			cell, err := serviceCell(ctx, cfg, h, s, svc, spec, ids, len(cells), prog)
			if err != nil {
				return cells, err
			}
			cells = append(cells, cell)
		}
	}
	return cells, nil
}

// serviceCell measures one cell Reps times, alternating which of the
// service and the store runs first. index numbers the cell for the seeds.
func serviceCell(ctx context.Context, cfg ServiceConfig, h *harness, s Strategy, svc *service, spec workload.Spec,
	ids []string, index int, prog *progress) (report.ServiceCell, error) {
	cell := report.ServiceCell{
		Strategy: s.Name, Keys: spec.Keys, Limit: spec.Limit, Workers: spec.Workers,
		Duration: spec.Duration.String(), LeaseSeconds: int(spec.TTL / time.Second), Pause: spec.Pause.String(),
	}
	if err := spec.Validate(); err != nil {
		return cell, fmt.Errorf("bench: service: %w", err)
	}
	if err := svc.loadKeys(ctx, ids, spec.Limit); err != nil {
		return cell, err
	}
	if err := svc.check(ctx, cell.LeaseSeconds); err != nil {
		return cell, err
	}
	svc.warm(ctx, spec.Workers)
	warmUp := spec
	warmUp.Duration = min(spec.Duration, serviceWarmUp)
	svc.drive(ctx, warmUp, ids, cfg.Seed)
	for r := range cfg.Reps {
		label := fmt.Sprintf("%s limit=%d workers=%d rep %d/%d", s.Name, spec.Limit, spec.Workers, r+1, cfg.Reps)
		seed := cfg.Seed + uint64(index*cfg.Reps+r)<<16
		rep := report.ServiceRep{ServiceFirst: r%2 == 0}
		for turn := range 2 {
			if (turn == 0) == rep.ServiceFirst {
				prog.start("service " + label)
				rep.Service = svc.drive(ctx, spec, ids, seed)
				prog.finish("service "+label, serviceSummary(rep.Service))
				continue
			}
			prog.start("store " + label)
			run, err := h.run(ctx, index*cfg.Reps+r, Cell{Scenario: "service", Spec: spec, Procs: 1}, s)
			if err != nil {
				return cell, fmt.Errorf("store %s: %w", label, err)
			}
			rep.Store = run
			prog.finish("store "+label, summary(run))
		}
		if err := ctx.Err(); err != nil {
			return cell, err
		}
		if rep.Store.GrantsPerSec == 0 {
			return cell, fmt.Errorf("bench: store %s granted nothing (first error: %s)", label, rep.Store.FirstError)
		}
		rep.ShareOfStore = rep.Service.CyclesPerSec / rep.Store.GrantsPerSec
		cell.Reps = append(cell.Reps, rep)
	}
	cell.Summarize()
	return cell, nil
}

// serviceSummary is a service run in one line.
func serviceSummary(r report.ServiceRun) string {
	s := fmt.Sprintf("%.0f cycles/s, allocate p50 %.2fms p99 %.2fms, %d of %d allocates 200",
		r.CyclesPerSec, r.AllocateLatency.P50, r.AllocateLatency.P99, r.AllocateStatus["200"], r.AllocateCalls)
	if !r.Audit.OK() {
		s += ", OVERSOLD"
	}
	return s
}
