package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/credpool/credpool/bench"
	"github.com/credpool/credpool/bench/workload"
)

// runBench is "credpool bench": with no grid flags it runs the standard
// suite. With -worker it is one worker process of a multi-process cell,
// started by the harness itself.
func runBench(args []string) error {
	std := bench.Standard()
	var (
		strategies, scenarios, workers, limits, procs, rates, holdDist string
		cfg                                                            bench.Config
		grid                                                           = std
		worker                                                         bool
	)
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&strategies, "strategies", "optimistic,lua", "lease stores to compare: optimistic, lua, sqlite")
	fs.StringVar(&cfg.RedisURL, "redis", "", "Redis URL for the Redis strategies; empty starts a throwaway redis-server on loopback")
	fs.BoolVar(&cfg.AllowRemote, "allow-remote", false, "allow a --redis server that is not on loopback (the harness loads it hard)")
	fs.StringVar(&cfg.OutDir, "out", "", "directory for results.json, results.csv, summary.md and plots/ (empty: stdout only)")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the callers' random choices")
	fs.StringVar(&scenarios, "scenarios", strings.Join(std.Scenarios, ","), "scenarios: uniform, zipf, hot, identical")
	fs.StringVar(&workers, "workers", joinInts(std.Workers), "concurrent callers in total (over all processes)")
	fs.StringVar(&limits, "limits", joinInts(std.Limits), "max_concurrent_uses of every key")
	fs.StringVar(&procs, "procs", joinInts(std.Procs), "OS processes sharing the callers")
	fs.StringVar(&rates, "rates", "0", "open-loop offered allocations/s over all processes; 0 is a closed loop")
	fs.IntVar(&grid.Keys, "keys", 0, "number of keys (0: the scenario's)")
	fs.IntVar(&grid.Candidates, "candidates", 0, "candidates per call (0: the scenario's)")
	fs.DurationVar(&grid.Hold, "hold", std.Hold, "hold time of a granted slot (the mean with -hold-dist exp)")
	fs.StringVar(&holdDist, "hold-dist", string(std.HoldDist), "hold time distribution: fixed or exp")
	fs.DurationVar(&grid.Duration, "duration", std.Duration, "length of each run (also bounds -ops)")
	fs.Int64Var(&grid.Ops, "ops", 0, "allocations per run over all processes (0: until -duration)")
	fs.Float64Var(&grid.CrashShare, "crash", 0, "share of grants never released (left to expire)")
	fs.DurationVar(&grid.TTL, "ttl", std.TTL, "lease length; far longer than any hold")
	fs.DurationVar(&grid.Pause, "pause", std.Pause, "closed loop: pause (±50%) after no slot, a give-up or an error")
	fs.BoolVar(&worker, "worker", false, "internal: run as a worker process of the harness")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench: unexpected argument %q", fs.Arg(0))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if worker {
		return bench.Worker(ctx, os.Stdin, os.Stdout, bench.Strategies())
	}

	var err error
	if cfg.Strategies, err = bench.Select(bench.Strategies(), strategies); err != nil {
		return err
	}
	grid.Scenarios = splitList(scenarios)
	grid.HoldDist = workload.HoldDist(holdDist)
	if grid.Workers, err = parseInts("workers", workers); err != nil {
		return err
	}
	if grid.Limits, err = parseInts("limits", limits); err != nil {
		return err
	}
	if grid.Procs, err = parseInts("procs", procs); err != nil {
		return err
	}
	if grid.Rates, err = parseFloats("rates", rates); err != nil {
		return err
	}
	if cfg.Cells, err = grid.Cells(); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench: find this binary to start workers: %w", err)
	}
	cfg.Worker = []string{exe, "bench", "-worker"}
	cfg.Args = os.Args
	cfg.Stdout, cfg.Progress = os.Stdout, os.Stderr
	start := time.Now()
	_, err = bench.Run(ctx, cfg)
	fmt.Fprintf(os.Stderr, "credpool bench: %d runs in %s\n", len(cfg.Cells)*len(cfg.Strategies), time.Since(start).Round(time.Second))
	return err
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

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
