package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/credpool/credpool/bench"
	"github.com/credpool/credpool/bench/workload"
)

// The standard suite's defaults for -strategies and -reps: the Redis
// stores with and without the per-key gate, four runs of each cell (an
// even count, so that in every cell each order of the strategies runs
// first equally often; see bench's reversed).
// Callers retry; a waiting caller's call waits up to defaultWait.
const (
	defaultStrategies = "optimistic,optimistic-nogate,lua,lua+gate"
	defaultReps       = 4
	defaultWait       = 10 * time.Second
)

// The -callers values.
const (
	retryCallers = "retry"
	waitCallers  = "wait"
)

// benchArgs is a parsed "credpool bench" command line: the standard
// harness (suite), the service benchmark (service set, svc) or a worker.
type benchArgs struct {
	worker  bool
	service bool
	suite   bench.Config
	svc     bench.ServiceConfig
}

// runBench is "credpool bench": with no grid flags it runs the standard
// suite, with -service the service benchmark. With -worker it is one
// worker process of a multi-process cell, started by the harness itself.
func runBench(args []string) error {
	b, err := parseBench(args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if b.worker {
		return bench.Worker(ctx, os.Stdin, os.Stdout, bench.Strategies())
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench: find this binary to start workers or the service: %w", err)
	}
	start := time.Now()
	var runs int
	if b.service {
		cfg := b.svc
		cfg.Serve = []string{exe, "serve"}
		cfg.Args = os.Args
		cfg.Stdout, cfg.Progress = os.Stdout, os.Stderr
		runs = cfg.Runs()
		_, err = bench.RunService(ctx, cfg)
	} else {
		cfg := b.suite
		cfg.Worker = []string{exe, "bench", "-worker"}
		cfg.Args = os.Args
		cfg.Stdout, cfg.Progress = os.Stdout, os.Stderr
		runs = len(cfg.Cells) * len(cfg.Strategies) * cfg.Reps
		_, err = bench.Run(ctx, cfg)
	}
	fmt.Fprintf(os.Stderr, "credpool bench: %d runs in %s\n", runs, time.Since(start).Round(time.Second))
	return err
}

// parseBench reads the flags; -h is flag.ErrHelp.
func parseBench(args []string) (benchArgs, error) {
	std := bench.Standard()
	var (
		strategies, scenarios, workers, limits, procs, rates, holdDist, pauses, callers string
		reps                                                                            int
		wait                                                                            time.Duration
		b                                                                               benchArgs
		cfg                                                                             = &b.suite
		grid                                                                            = std
	)
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&strategies, "strategies", defaultStrategies, "lease stores to compare: "+strings.Join(strategyNames(), ", ")+
		"; the -nogate and +gate ones measure the per-key gate (-service: "+serviceStrategies+")")
	fs.StringVar(&cfg.RedisURL, "redis", "", "Redis URL for the Redis strategies; empty starts a throwaway redis-server on loopback")
	fs.BoolVar(&cfg.RedisCluster, "redis-cluster", false, "treat -redis as a Redis Cluster URL (redis://host:port?addr=host2:port2); with no -redis, start a one-node cluster on loopback")
	fs.BoolVar(&cfg.AllowRemote, "allow-remote", false, "allow a --redis server that is not on loopback (the harness loads it hard)")
	fs.StringVar(&cfg.OutDir, "out", "", "directory for results.json, results.csv, summary.md and plots/ (-service: results.json, summary.md; empty: stdout only)")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the callers' random choices")
	fs.StringVar(&scenarios, "scenarios", strings.Join(std.Scenarios, ","), "scenarios: uniform, zipf, hot, identical")
	fs.StringVar(&workers, "workers", joinInts(std.Workers), "concurrent callers in total (over all processes) (-service: "+serviceWorkers+")")
	fs.StringVar(&limits, "limits", joinInts(std.Limits), "max_concurrent_uses of every key (-service: "+serviceLimits+")")
	fs.StringVar(&procs, "procs", joinInts(std.Procs), "OS processes sharing the callers")
	fs.StringVar(&rates, "rates", "0", "open-loop offered allocations/s over all processes; 0 is a closed loop")
	fs.IntVar(&grid.Keys, "keys", 0, "number of keys (0: the scenario's; -service: "+strconv.Itoa(serviceKeys)+")")
	fs.IntVar(&grid.Candidates, "candidates", 0, "candidates per call (0: the scenario's)")
	fs.DurationVar(&grid.Hold, "hold", std.Hold, "hold time of a granted slot (the mean with -hold-dist exp)")
	fs.StringVar(&holdDist, "hold-dist", string(std.HoldDist), "hold time distribution: fixed or exp")
	fs.DurationVar(&grid.Duration, "duration", std.Duration, "length of each run (also bounds -ops) (-service: "+serviceDuration.String()+")")
	fs.Int64Var(&grid.Ops, "ops", 0, "allocations per run over all processes (0: until -duration)")
	fs.Float64Var(&grid.CrashShare, "crash", 0, "share of grants never released (left to expire)")
	fs.DurationVar(&grid.TTL, "ttl", std.TTL, "lease length; far longer than any hold (-service: whole seconds)")
	fs.StringVar(&pauses, "pause", joinDurations(std.Pauses), "closed loop: pauses (±50%) after no slot, a give-up or an error, each its own cells (-service: one, default "+std.Pauses[0].String()+")")
	fs.StringVar(&callers, "callers", retryCallers, "closed loop: what callers do after no slot, each its own cells: retry (pause, see -pause) "+
		"or wait (wait in line for a slot up to -wait, never past the run's end; stores that cannot wait skip these cells)")
	fs.DurationVar(&wait, "wait", defaultWait, "-callers wait: how long one call may wait for a slot")
	fs.BoolVar(&b.service, "service", false, "benchmark credpool serve over HTTP against its lease store alone, on SQLite and on Redis")
	fs.IntVar(&reps, "reps", defaultReps, "repetitions of each cell, alternating the strategies' order; tables show the median and range")
	fs.StringVar(&b.svc.Catalog, "catalog", bench.CatalogSQLite, "-service: the catalog of credpool serve: sqlite (a file) or postgres (a throwaway PostgreSQL server on loopback; needs -strategies optimistic)")
	fs.BoolVar(&b.svc.CatalogEach, "catalog-each", false, "-service: give each instance a catalog of its own with the same keys, instead of one they share (a control for what sharing costs; needs -strategies optimistic)")
	fs.Func("instances", "-service: credpool serve processes sharing Redis and the catalog (unless -catalog-each), each count measured in the same repetitions, e.g. 1,3 (default 1)", func(v string) (err error) {
		b.svc.Instances, err = parseInts("instances", v)
		return err
	})
	fs.BoolVar(&b.worker, "worker", false, "internal: run as a worker process of the harness")
	if err := fs.Parse(args); err != nil {
		return b, err
	}
	if fs.NArg() > 0 {
		return b, fmt.Errorf("bench: unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if b.worker {
		return b, nil
	}
	ps, err := parseDurations("pause", pauses)
	if err != nil {
		return b, err
	}
	if b.service {
		if set["callers"] || set["wait"] {
			return b, errors.New("bench: -callers and -wait do not apply to -service")
		}
		if !set["pause"] {
			ps = std.Pauses[:1]
		}
		if len(ps) != 1 {
			return b, errors.New("bench: -service takes one -pause")
		}
		b.svc.Reps = reps
		err := parseService(&b.svc, set, serviceFlags{
			strategies: strategies, workers: workers, limits: limits, procs: procs, rates: rates,
			keys: grid.Keys, duration: grid.Duration, ttl: grid.TTL, pause: ps[0], suite: *cfg,
		})
		return b, err
	}
	for _, name := range []string{"catalog", "catalog-each", "instances"} {
		if set[name] {
			return b, fmt.Errorf("bench: -%s needs -service", name)
		}
	}

	if reps < 1 {
		return b, errors.New("bench: -reps must be at least 1")
	}
	cfg.Reps, grid.Pauses = reps, ps
	if cfg.Strategies, err = bench.Select(bench.Strategies(), strategies); err != nil {
		return b, err
	}
	grid.Scenarios = splitList(scenarios)
	grid.HoldDist = workload.HoldDist(holdDist)
	if grid.Workers, err = parseInts("workers", workers); err != nil {
		return b, err
	}
	if grid.Limits, err = parseInts("limits", limits); err != nil {
		return b, err
	}
	if grid.Procs, err = parseInts("procs", procs); err != nil {
		return b, err
	}
	if grid.Rates, err = parseFloats("rates", rates); err != nil {
		return b, err
	}
	if grid.Waits, err = parseCallers(callers, wait); err != nil {
		return b, err
	}
	cfg.Cells, err = grid.Cells()
	return b, err
}

// parseCallers turns -callers into the grid's waits: 0 for retry, wait
// for wait.
func parseCallers(s string, wait time.Duration) ([]time.Duration, error) {
	var waits []time.Duration
	for _, v := range splitList(s) {
		switch v {
		case retryCallers:
			waits = append(waits, 0)
		case waitCallers:
			if wait <= 0 {
				return nil, errors.New("bench: -wait must be positive")
			}
			waits = append(waits, wait)
		default:
			return nil, fmt.Errorf("bench: -callers: %q is neither %s nor %s", v, retryCallers, waitCallers)
		}
		if slices.Index(waits, waits[len(waits)-1]) < len(waits)-1 {
			return nil, fmt.Errorf("bench: -callers: %s listed twice", v)
		}
	}
	if len(waits) == 0 {
		return nil, errors.New("bench: -callers names none")
	}
	return waits, nil
}

func splitList(s string) []string {
	var out []string
	for v := range strings.SplitSeq(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

func parseInts(name, s string) ([]int, error) {
	var out []int
	for _, v := range splitList(s) {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, fmt.Errorf("bench: -%s: %q is not a whole number", name, v)
		}
		out = append(out, n)
	}
	return out, nil
}

func parseFloats(name, s string) ([]float64, error) {
	var out []float64
	for _, v := range splitList(s) {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, fmt.Errorf("bench: -%s: %q is not a number", name, v)
		}
		out = append(out, f)
	}
	return out, nil
}

func parseDurations(name, s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, v := range splitList(s) {
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, fmt.Errorf("bench: -%s: %q is not a duration", name, v)
		}
		out = append(out, d)
	}
	return out, nil
}

func joinDurations(ds []time.Duration) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.String()
	}
	return strings.Join(s, ",")
}

func strategyNames() []string {
	var names []string
	for _, s := range bench.Strategies() {
		names = append(names, s.Name)
	}
	return names
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
