package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/credpool/credpool/bench/report"
	"github.com/credpool/credpool/bench/workload"
	"github.com/credpool/credpool/optimistic"
)

// inspectBatch bounds the keys one Inspect call reads in the state check.
const inspectBatch = 256

// Config is one harness run.
type Config struct {
	// Strategies are measured in this order, each on every cell.
	Strategies []Strategy
	Cells      []Cell
	// Reps is how many times each cell runs on every strategy, the
	// strategies in the given order, then in the reverse, alternately,
	// every other cell starting with the reverse (see reversed): an even
	// number favours neither order in any cell, whatever running first
	// does to a run.
	// Each repetition has its own seed, which all strategies of it share;
	// 0 means 1.
	Reps int
	// RedisURL is the server of the Redis strategies. Empty starts a
	// throwaway redis-server on loopback for the run.
	RedisURL string
	// RedisCluster reads RedisURL as a Redis Cluster's
	// (redis://host:port?addr=host2:port2); with an empty RedisURL the
	// throwaway server is a one-node cluster.
	RedisCluster bool
	// AllowRemote permits a RedisURL that is not on loopback.
	AllowRemote bool
	// OutDir receives results.json, results.csv, summary.md and plots/.
	// Empty writes no files.
	OutDir string
	// Seed makes the callers' choices reproducible; every strategy sees
	// the same choices in a cell.
	Seed uint64
	// Worker is the command line of a worker process, which must run
	// Worker on its stdin and stdout with the same strategies. Only cells
	// with Procs > 1 need it.
	Worker []string
	// WorkerEnv is added to the worker processes' environment.
	WorkerEnv []string
	// Args is the command line the report records.
	Args []string
	// Stdout receives the Markdown report and Progress the progress; nil
	// discards either.
	Stdout, Progress io.Writer
}

// Run measures every cell on every strategy, then writes the reports. A
// strategy whose store cannot wait (not an optimistic.Waiter) skips the
// cells of waiting callers; the report says so. It returns an error
// wrapping ErrOversold, with the report, if the oversell audit failed in
// any run; other errors stop it at once.
func Run(ctx context.Context, cfg Config) (*report.Report, error) {
	if len(cfg.Strategies) == 0 || len(cfg.Cells) == 0 {
		return nil, errors.New("bench: nothing to run")
	}
	if len(cfg.Worker) == 0 && slices.ContainsFunc(cfg.Cells, func(c Cell) bool { return c.Procs > 1 }) {
		return nil, errors.New("bench: cells with several processes need a worker command")
	}
	rep := &report.Report{}
	h, done, err := newHarness(ctx, &cfg, &rep.Env)
	if err != nil {
		return nil, err
	}
	defer done()

	reps := max(cfg.Reps, 1)
	prog := newProgress(cfg.Progress, len(cfg.Cells)*len(cfg.Strategies)*reps)
	for i, cell := range cfg.Cells {
		for r := range reps {
			order := slices.Clone(cfg.Strategies)
			if reversed(i, r) {
				slices.Reverse(order)
			}
			for _, s := range order {
				label := fmt.Sprintf("%s %s %s limit=%d workers=%d procs=%d %s rep %d/%d",
					s.Name, cell.Scenario, loopName(cell.Spec), cell.Spec.Limit, cell.Spec.Workers, cell.Procs,
					callersName(cell.Spec), r+1, reps)
				prog.start(label)
				run, err := h.run(ctx, i*reps+r, cell, s)
				if errors.Is(err, workload.ErrCannotWait) {
					rep.Skip(s.Name, "waiting callers: the store cannot wait for a slot")
					prog.finish(label, "skipped: the store cannot wait for a slot")
					continue
				}
				if err != nil {
					prog.close()
					return rep, fmt.Errorf("%s: %w", label, err)
				}
				run.Rep = r + 1
				rep.Runs = append(rep.Runs, run)
				prog.finish(label, summary(run))
			}
		}
	}
	prog.close()
	if err := write(rep, cfg); err != nil {
		return rep, err
	}
	if rep.Failed() {
		return rep, fmt.Errorf("%w: see the report", ErrOversold)
	}
	return rep, nil
}

// reversed says whether repetition rep of cell i runs in the reverse
// order. Repetitions alternate, so an even number of them runs each order
// first equally often in every cell. Odd cells start with the reverse:
// with an odd number one order comes first once more in a cell, and the
// next cell evens it out over the suite, though not within a row (in the
// standard grid, whose innermost dimension is procs, every 1-process cell
// would lean one way and every 4-process cell the other).
func reversed(cell, rep int) bool { return (cell+rep)%2 == 1 }

func write(rep *report.Report, cfg Config) error {
	if cfg.Stdout != nil {
		if err := rep.WriteMarkdown(cfg.Stdout); err != nil {
			return err
		}
	}
	if cfg.OutDir == "" {
		return nil
	}
	_, err := rep.WriteFiles(cfg.OutDir)
	return err
}

func loopName(spec workload.Spec) string {
	if spec.Rate > 0 {
		return fmt.Sprintf("open@%g/s", spec.Rate)
	}
	return "closed"
}

// callersName says how the callers wait for a slot: pausing, or in line.
func callersName(spec workload.Spec) string {
	if spec.Wait > 0 {
		return "wait=" + spec.Wait.String()
	}
	return "pause=" + spec.Pause.String()
}

func summary(r report.Run) string {
	s := fmt.Sprintf("%.0f grants/s, p99 %.2fms, time to grant p99 %.2fms", r.GrantsPerSec, r.GrantLatency.P99, r.TimeToGrant.P99)
	if r.ConflictsPerGrant != nil && *r.ConflictsPerGrant > 0 {
		s += fmt.Sprintf(", %.2f conflicts/grant", *r.ConflictsPerGrant)
	}
	if r.RequestsPerGrant != nil {
		s += fmt.Sprintf(", %.2f requests/grant", *r.RequestsPerGrant)
	}
	s += ", max/min grants per caller " + report.FormatMaxOverMin(r.Fairness)
	if !r.Audit.OK() {
		s += ", OVERSOLD"
	}
	return s
}

// harness is the state of one Run.
// newHarness records the environment in env, starts (or connects to) the
// Redis server if a strategy needs one, and makes a temp dir; done stops
// and removes them.
func newHarness(ctx context.Context, cfg *Config, env *report.Env) (h *harness, done func(), err error) {
	*env = report.CollectEnv(cfg.Args)
	for _, s := range cfg.Strategies {
		env.Strategies = append(env.Strategies, s.Name)
	}
	h = &harness{cfg: cfg, id: time.Now().UnixNano()}
	var stops []func()
	done = func() {
		for _, stop := range slices.Backward(stops) {
			stop()
		}
	}
	if slices.ContainsFunc(cfg.Strategies, func(s Strategy) bool { return s.Redis }) {
		srv, err := startRedis(ctx, cfg.RedisURL, cfg.RedisCluster, cfg.AllowRemote)
		if err != nil {
			return nil, nil, err
		}
		stops = append(stops, srv.stop)
		h.redis = srv
		if env.Redis, err = srv.version(ctx); err != nil {
			done()
			return nil, nil, err
		}
		env.RedisServer = srv.where
	}
	if h.tmp, err = os.MkdirTemp("", "credpool-bench-"); err != nil {
		done()
		return nil, nil, fmt.Errorf("bench: %w", err)
	}
	stops = append(stops, func() { _ = os.RemoveAll(h.tmp) })
	return h, done, nil
}

type harness struct {
	cfg   *Config
	redis *server // nil without Redis strategies
	tmp   string
	id    int64 // distinguishes this run's key prefixes from other runs'
	runs  int
}

// run measures one cell on one strategy in a fresh key space, with the
// seed numbered seedIndex (one per cell and repetition), and removes that
// key space afterwards; a failed removal is an error.
func (h *harness) run(ctx context.Context, seedIndex int, cell Cell, s Strategy) (_ report.Run, err error) {
	h.runs++
	spec := cell.Spec
	loc := location{PoolSize: share(spec, cell.Procs, 0).Workers + 2}
	if s.Redis {
		loc.RedisURL, loc.Cluster = h.redis.url, h.redis.cluster
		loc.Prefix = fmt.Sprintf("credpool-bench-%d-%d", h.id, h.runs)
	} else {
		loc.Path = filepath.Join(h.tmp, fmt.Sprintf("run-%d.db", h.runs))
	}
	c, err := loc.open(ctx, s)
	if err != nil {
		return report.Run{}, err
	}
	defer c.close()
	if _, ok := c.store.(optimistic.Waiter); spec.Wait > 0 && !ok {
		return report.Run{}, workload.ErrCannotWait
	}
	if s.Redis {
		// Removed even if the run fails half-way; nothing else uses the prefix.
		defer func() { err = errors.Join(err, h.redis.dropPrefix(context.WithoutCancel(ctx), loc.Prefix)) }()
	}
	if err := syncKeys(ctx, c.store, spec); err != nil {
		return report.Run{}, err
	}
	// The same seed for every strategy of a cell: they face the same choices.
	seed := h.cfg.Seed + uint64(seedIndex)<<16
	var before map[string]int64
	snapshot := func() (err error) {
		if s.Redis {
			before, err = h.redis.commandStats(ctx)
		}
		return err
	}
	var (
		res    *workload.Result
		trips  int64
		during *sampler // the state read during the run, see sampler
	)
	if spec.Hold == 0 {
		// Read through a client of its own, so that the run's round trips
		// leave these out.
		probe, err := loc.open(ctx, s)
		if err != nil {
			return report.Run{}, err
		}
		defer probe.close()
		during = sample(ctx, probe.store.Inspect, spec.KeyIDs(), spec.Limit, inspectBatch)
		defer during.stop()
	}
	if cell.Procs == 1 {
		warm(ctx, c.target, spec.Workers)
		holders := workload.NewHolders(spec.Keys, spec.Limit)
		if err := snapshot(); err != nil {
			return report.Run{}, err
		}
		trips = -c.roundTrips.Total()
		res, err = workload.Run(ctx, c.store, spec, holders, seed)
		trips += c.roundTrips.Total()
	} else {
		path := filepath.Join(h.tmp, fmt.Sprintf("holders-%d", h.runs))
		if err := workload.CreateHoldersFile(path, spec.Keys); err != nil {
			return report.Run{}, err
		}
		res, trips, err = runProcs(ctx, h.cfg, cell, s, loc, path, seed, snapshot)
	}
	if err != nil {
		return report.Run{}, err
	}
	run := newRun(s, cell, res)
	if during != nil {
		run.Audit.Add(during.stop())
	}
	if s.Redis {
		after, err := h.redis.commandStats(ctx)
		if err != nil {
			return report.Run{}, err
		}
		var total int64
		run.Commands, total = commandDelta(before, after)
		run.CommandsPerGrant = perGrant(total, res.Grants)
		run.RoundTripsPerGrant = perGrant(trips, res.Grants)
		run.RequestsPerGrant = perGrant(trips+subscriptions(run.Commands), res.Grants)
	}
	if err := stateCheck(ctx, c.store, spec, &run.Audit); err != nil {
		return report.Run{}, err
	}
	return run, nil
}

// syncKeys puts the workload's keys into a fresh store.
func syncKeys(ctx context.Context, store optimistic.LeaseStore, spec workload.Spec) error {
	for i := range spec.Keys {
		if err := store.SyncKey(ctx, spec.Key(i)); err != nil {
			return fmt.Errorf("bench: sync key %d: %w", i, err)
		}
	}
	return nil
}

// warm opens up to n pooled Redis connections before the clock starts, so
// the run does not pay for dialing.
func warm(ctx context.Context, t Target, n int) {
	if t.Redis == nil {
		return
	}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { _ = t.Redis.Ping(ctx).Err() })
	}
	wg.Wait()
}

// stateCheck is the audit's second half: in the store's own state after the
// run, no key may have more live leases than its limit.
func stateCheck(ctx context.Context, store optimistic.LeaseStore, spec workload.Spec, a *report.Audit) error {
	for batch := range slices.Chunk(spec.KeyIDs(), inspectBatch) {
		infos, err := store.Inspect(ctx, batch...)
		if err != nil {
			return fmt.Errorf("bench: state check: %w", err)
		}
		checkLive(infos, spec.Limit, "afterwards", a)
	}
	return nil
}

// newRun turns a workload result into a report row.
func newRun(s Strategy, cell Cell, res *workload.Result) report.Run {
	spec := cell.Spec
	secs := res.Elapsed.Seconds()
	rate := func(n int64) float64 {
		if secs <= 0 {
			return 0
		}
		return float64(n) / secs
	}
	loop := "closed"
	if spec.Rate > 0 {
		loop = "open"
	}
	var wait string
	if spec.Wait > 0 {
		wait = spec.Wait.String()
	}
	return report.Run{
		Strategy: s.Name, Scenario: cell.Scenario, Loop: loop, Rate: spec.Rate,
		Keys: spec.Keys, Limit: spec.Limit, Candidates: spec.Candidates,
		Choice: string(spec.Choice), Order: string(spec.Order),
		Workers: spec.Workers, Procs: cell.Procs,
		Hold: spec.Hold.String(), HoldDist: string(spec.HoldDist), Duration: spec.Duration.String(),
		Ops: spec.Ops, CrashShare: spec.CrashShare, TTL: spec.TTL.String(), Pause: spec.Pause.String(), Wait: wait,
		ElapsedSeconds: secs,
		Counts: report.Counts{
			Calls: res.Calls, Grants: res.Grants, NoSlot: res.NoSlot, GiveUps: res.GiveUps, Errors: res.Errors,
			Attempts: res.Attempts, Conflicts: res.Conflicts, Pruned: res.Pruned, Released: res.Released,
			Crashed: res.Crashed, Lost: res.Lost, ReleaseErrors: res.ReleaseErrors, Offered: res.Offered,
			Waiting: res.Waiting, ShortHolds: res.ShortHolds,
		},
		GrantsPerSec: rate(res.Grants), NoSlotPerSec: rate(res.NoSlot),
		GiveUpsPerSec: rate(res.GiveUps), ErrorsPerSec: rate(res.Errors),
		ConflictsPerGrant: perGrant(res.Conflicts, res.Grants),
		AttemptsPerGrant:  perGrant(res.Attempts, res.Grants),
		HoldExcessMicros:  holdExcess(res),
		GrantLatency:      latency(res.GrantLatency),
		CallLatency:       latency(res.Latency),
		TimeToGrant:       latency(res.TimeToGrant),
		Audit: report.Audit{
			HolderViolations: res.Violations, MaxHolders: res.MaxHolders, First: res.FirstViolation,
		},
		Fairness:   report.FairnessOf(res.CallerGrants),
		FirstError: res.FirstError,
	}
}

// holdExcess is res's mean hold excess in µs, nil if no hold was timed.
func holdExcess(res *workload.Result) *float64 {
	if res.Held == 0 {
		return nil
	}
	v := float64(res.HoldExcess) / float64(time.Microsecond) / float64(res.Held)
	return &v
}

func perGrant(n, grants int64) *float64 {
	if grants == 0 {
		return nil
	}
	v := float64(n) / float64(grants)
	return &v
}

func latency(h *workload.Histogram) report.Latency {
	if h == nil {
		return report.Latency{}
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	p := h.Summary()
	return report.Latency{P50: ms(p.P50), P90: ms(p.P90), P99: ms(p.P99), P999: ms(p.P999), Max: ms(p.Max)}
}
