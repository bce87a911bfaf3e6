package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"time"

	"github.com/credpool/credpool/bench/report"
	"github.com/credpool/credpool/bench/workload"
	"github.com/credpool/credpool/internal/pgproc"
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

// The catalogs credpool serve keeps its keys in (ServiceConfig.Catalog).
const (
	// CatalogSQLite is a file in the harness's temp directory, which the
	// instances share on this host.
	CatalogSQLite = "sqlite"
	// CatalogPostgres is a fresh database per strategy on a throwaway
	// PostgreSQL server on loopback; it needs a Redis lease store.
	CatalogPostgres = "postgres"
)

// ServiceConfig is one service benchmark: credpool serve, run as its own
// process and driven over HTTP, against its lease store alone under the
// harness, cell by cell in the same run.
type ServiceConfig struct {
	// Strategies are the lease stores to run the service on, in this
	// order; each is measured alone too. See ServiceStrategies.
	Strategies []Strategy
	// Catalog is where the service keeps its catalog: CatalogSQLite or
	// CatalogPostgres.
	//
	// default: CatalogSQLite
	Catalog string
	// Instances are the numbers of credpool serve processes, sharing the
	// lease store and the catalog (unless CatalogEach), that every cell is
	// measured with, in the same repetitions; the callers are spread
	// round-robin over them.
	//
	// default: [1]
	Instances []int
	// CatalogEach gives every instance a catalog of its own (a file, or a
	// database on the PostgreSQL server) holding the same keys, loaded
	// through each, instead of one they share; the lease store is still
	// shared. It is a control: what running that many instances costs on
	// this machine when none shares a catalog. It needs a Redis store.
	CatalogEach bool
	// Keys is the number of keys, all in one provider, pool and model.
	Keys int
	// Every cell is one limit (every key's max_concurrent_uses) with one
	// number of concurrent callers.
	Limits, Workers []int
	// Duration is the length of each run, of the service and of the store.
	Duration time.Duration
	// Reps is how many times each cell runs, the service first (fewest
	// instances first) in odd repetitions and the store first in even
	// ones.
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
	// RedisCluster reads RedisURL as a Redis Cluster's, for the service
	// (--redis-cluster) and the store alone; with an empty RedisURL the
	// throwaway server is a one-node cluster.
	RedisCluster bool
	// AllowRemote permits a RedisURL that is not on loopback.
	AllowRemote bool
	// OutDir receives results.json and summary.md. Empty writes no files.
	OutDir string
	// Seed makes the callers' choices reproducible.
	Seed uint64
	// Serve is the command line of "credpool serve", to which the harness
	// adds --listen; the catalog, Redis and the keys go in its environment.
	// ServeEnv is added to that environment, which keeps none of this
	// process's CREDPOOL_ variables.
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

// withDefaults is cfg with the defaults of the fields left empty.
func (cfg ServiceConfig) withDefaults() ServiceConfig {
	if cfg.Catalog == "" {
		cfg.Catalog = CatalogSQLite
	}
	if len(cfg.Instances) == 0 {
		cfg.Instances = []int{1}
	}
	return cfg
}

// Runs is the number of measured runs: per cell and repetition, one of
// the service at every instance count and one of the store.
func (cfg ServiceConfig) Runs() int {
	cfg = cfg.withDefaults()
	return cfg.Reps * len(cfg.Strategies) * len(cfg.Limits) * len(cfg.Workers) * (len(cfg.Instances) + 1)
}

// Validate returns an error naming the first field out of range; it does
// not look at Serve.
func (cfg ServiceConfig) Validate() error {
	cfg = cfg.withDefaults()
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
	case cfg.Catalog != CatalogSQLite && cfg.Catalog != CatalogPostgres:
		return fmt.Errorf("bench: service: unknown catalog %q (have %s, %s)", cfg.Catalog, CatalogSQLite, CatalogPostgres)
	case slices.Min(cfg.Instances) < 1:
		return errors.New("bench: service: instances must be at least 1")
	case cfg.CatalogEach && slices.Max(cfg.Instances) < 2:
		return errors.New("bench: service: a catalog each needs more than one instance (-instances 1,3)")
	}
	for i, n := range cfg.Instances {
		if slices.Contains(cfg.Instances[:i], n) {
			return fmt.Errorf("bench: service: %d instances listed twice", n)
		}
	}
	for _, s := range cfg.Strategies {
		if !slices.ContainsFunc(ServiceStrategies(), func(t Strategy) bool { return t.Name == s.Name }) {
			return fmt.Errorf("bench: service: credpool serve has no %s lease store (have %s)", s.Name, strategyNames(ServiceStrategies()))
		}
		if !s.Redis && cfg.CatalogEach {
			return fmt.Errorf("bench: service: the %s lease store lives in the catalog's file, so instances with a "+
				"catalog each would not share their leases: use a Redis store (-strategies optimistic)", s.Name)
		}
		if !s.Redis && cfg.Catalog == CatalogPostgres {
			return fmt.Errorf("bench: service: the %s lease store lives in a SQLite catalog's file, so credpool serve "+
				"refuses it with a PostgreSQL catalog: use a Redis store (-strategies optimistic)", s.Name)
		}
	}
	return nil
}

// RunService measures every cell on every strategy: it starts the most
// instances of credpool serve on the strategy's store and a fresh
// catalog (or one each, CatalogEach), loads the keys through the first
// one's admin API (each one's, with CatalogEach), runs the
// service unmeasured for a moment, and in each repetition runs the
// service's closed loop (allocate, then report success, which releases)
// at every instance count and the store's alone (Allocate, then Release
// at once) with the same keys, limit and callers. Then it stops the
// service, removes everything it started or wrote but the reports, and
// writes those. It returns an error wrapping ErrOversold, with the report,
// if an oversell audit failed; other errors stop it at once.
func RunService(ctx context.Context, cfg ServiceConfig) (*report.ServiceReport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if len(cfg.Serve) == 0 {
		return nil, errors.New("bench: service: no command line for credpool serve")
	}
	rep := &report.ServiceReport{}
	h, done, err := newHarness(ctx, &Config{
		Strategies: cfg.Strategies, RedisURL: cfg.RedisURL, RedisCluster: cfg.RedisCluster, AllowRemote: cfg.AllowRemote, Seed: cfg.Seed, Args: cfg.Args,
	}, &rep.Env)
	if err != nil {
		return nil, err
	}
	defer done()
	var pg *pgproc.Server
	if cfg.Catalog == CatalogPostgres {
		if pg, rep.Postgres, err = startPostgres(ctx); err != nil {
			return nil, err
		}
		defer pg.Stop()
	}

	prog := newProgress(cfg.Progress, cfg.Runs())
	for _, s := range cfg.Strategies {
		cells, err := serviceCells(ctx, cfg, h, pg, s, prog)
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

// serviceCells runs every cell of one strategy on credpool serve
// processes sharing a fresh catalog (on pg for CatalogPostgres), or each
// with its own (CatalogEach), which it stops at the end.
func serviceCells(ctx context.Context, cfg ServiceConfig, h *harness, pg *pgproc.Server, s Strategy, prog *progress) (_ []report.ServiceCell, err error) {
	dbs, err := catalogs(ctx, cfg, h, pg, s.Name)
	if err != nil {
		return nil, err
	}
	o := serveOptions{argv: cfg.Serve, env: cfg.ServeEnv, internal: randomHex(), admin: randomHex(), secret: secretKey()}
	if s.Redis {
		o.redisURL, o.cluster = h.redis.url, cfg.RedisCluster
	}
	var svcs []*service
	defer func() {
		for _, svc := range slices.Backward(svcs) {
			err = errors.Join(err, svc.stop())
		}
	}()
	// One after the other: the first migrates a shared catalog.
	for _, db := range dbs {
		o.db = db
		svc, err := startService(ctx, o)
		if err != nil {
			return nil, err
		}
		svcs = append(svcs, svc)
	}
	// The instances that hold the keys in their catalogs: the first, or
	// every one.
	loaders := svcs[:1]
	if cfg.CatalogEach {
		loaders = svcs
	}
	// Ids of this run alone: a Redis the harness did not start may hold
	// another service's keys.
	ids := make([]string, cfg.Keys)
	for i := range ids {
		ids[i] = fmt.Sprintf("bench-%d-%d", h.id, i)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		for _, svc := range loaders {
			err = errors.Join(err, svc.deleteKeys(cctx, ids))
		}
	}()
	var cells []report.ServiceCell
	index := 0
	for _, limit := range cfg.Limits {
		for _, workers := range cfg.Workers {
			spec := workload.Spec{
				Keys: cfg.Keys, Limit: limit, Candidates: cfg.Keys, Choice: workload.Uniform, Order: workload.Ranked,
				Workers: workers, HoldDist: workload.Fixed, Duration: cfg.Duration, TTL: cfg.TTL, Pause: cfg.Pause,
			}
			more, err := serviceCell(ctx, cfg, h, s, svcs, loaders, spec, ids, index, prog)
			if err != nil {
				return cells, err
			}
			cells = append(cells, more...)
			index++
		}
	}
	return cells, nil
}

// catalogs returns the catalog of each of the most instances of cfg, for
// strategy: one fresh catalog for all (on pg for CatalogPostgres, else a
// file in h's directory), or a fresh one each with CatalogEach.
func catalogs(ctx context.Context, cfg ServiceConfig, h *harness, pg *pgproc.Server, strategy string) ([]string, error) {
	fresh := func(name string) (string, error) {
		if pg == nil {
			return filepath.Join(h.tmp, "catalog-"+name+".db"), nil
		}
		return newCatalogDB(ctx, pg, fmt.Sprintf("bench_%d_%s", h.id, name))
	}
	dbs := make([]string, slices.Max(cfg.Instances))
	if !cfg.CatalogEach {
		db, err := fresh(strategy)
		if err != nil {
			return nil, err
		}
		for i := range dbs {
			dbs[i] = db
		}
		return dbs, nil
	}
	for i := range dbs {
		db, err := fresh(fmt.Sprintf("%s_%d", strategy, i+1))
		if err != nil {
			return nil, err
		}
		dbs[i] = db
	}
	return dbs, nil
}

// serviceCell measures one cell Reps times at every instance count, and
// the store alone, and returns one cell per instance count. A repetition
// runs the service at each count, fewest first, then the store, or all in
// the reverse order, alternately, odd cells starting with the reverse (see
// reversed). svcs are the running instances, of which a run at n uses the
// first n, and loaders those whose catalogs get the keys; index numbers
// the cell for the seeds and the order.
func serviceCell(ctx context.Context, cfg ServiceConfig, h *harness, s Strategy, svcs, loaders []*service, spec workload.Spec,
	ids []string, index int, prog *progress) ([]report.ServiceCell, error) {
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("bench: service: %w", err)
	}
	counts := slices.Sorted(slices.Values(cfg.Instances))
	cells := make([]report.ServiceCell, len(counts))
	for i, n := range counts {
		cells[i] = report.ServiceCell{
			Strategy: s.Name, Catalog: cfg.Catalog, CatalogEach: cfg.CatalogEach && n > 1, Instances: n, Keys: spec.Keys, Limit: spec.Limit, Workers: spec.Workers,
			Duration: spec.Duration.String(), LeaseSeconds: int(spec.TTL / time.Second), Pause: spec.Pause.String(),
		}
	}
	for _, svc := range loaders {
		if err := svc.loadKeys(ctx, ids, spec.Limit); err != nil {
			return nil, err
		}
	}
	// A cell starts with no lease taken: one a failed cycle of the cell
	// before left (an answer lost, a report that failed) would count
	// against a lower limit here, where the audit reads the store.
	if err := svcs[0].clearLeases(ctx, ids); err != nil {
		return nil, err
	}
	// Every instance grants from the catalog the keys were written to.
	for _, svc := range svcs {
		if err := svc.check(ctx, cells[0].LeaseSeconds); err != nil {
			return nil, err
		}
	}
	warmUp := spec
	warmUp.Duration = min(spec.Duration, serviceWarmUp)
	// The warm-up is not measured, but audited: what it finds counts in
	// the first repetition's audit.
	warmed := make([]report.Audit, len(counts))
	for i, n := range counts {
		warmed[i] = drive(ctx, svcs[:n], warmUp, ids, cfg.Seed).Audit
	}
	// The store alone warms up too, so that neither side of the ratio is
	// the only one to start cold (this process's heap, Redis's).
	storeWarmed, err := h.run(ctx, index*cfg.Reps, Cell{Scenario: "service", Spec: warmUp, Procs: 1}, s)
	if err != nil {
		return nil, fmt.Errorf("store %s warm-up: %w", s.Name, err)
	}
	for r := range cfg.Reps {
		seed := cfg.Seed + uint64(index*cfg.Reps+r)<<16
		label := fmt.Sprintf("limit=%d workers=%d rep %d/%d", spec.Limit, spec.Workers, r+1, cfg.Reps)
		runs := make([]report.ServiceRun, len(counts))
		var store report.Run
		// Turn i < len(counts) is the service at counts[i], the last the store.
		turns := make([]int, len(counts)+1)
		for i := range turns {
			turns[i] = i
		}
		if reversed(index, r) {
			slices.Reverse(turns)
		}
		for _, i := range turns {
			if i < len(counts) {
				what := fmt.Sprintf("service %s on %s × %d %s", s.Name, cells[i].CatalogName(), counts[i], label)
				prog.start(what)
				runs[i] = drive(ctx, svcs[:counts[i]], spec, ids, seed)
				if r == 0 {
					runs[i].Audit.Add(warmed[i])
				}
				prog.finish(what, serviceSummary(runs[i]))
				continue
			}
			what := fmt.Sprintf("store %s %s", s.Name, label)
			prog.start(what)
			run, err := h.run(ctx, index*cfg.Reps+r, Cell{Scenario: "service", Spec: spec, Procs: 1}, s)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", what, err)
			}
			if r == 0 {
				run.Audit.Add(storeWarmed.Audit)
			}
			store = run
			prog.finish(what, summary(run))
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if store.GrantsPerSec == 0 {
			return nil, fmt.Errorf("bench: store %s %s granted nothing (first error: %s)", s.Name, label, store.FirstError)
		}
		for i := range cells {
			rep := report.ServiceRep{
				ServiceFirst: !reversed(index, r), Service: runs[i], Store: store,
				ShareOfStore: runs[i].CyclesPerSec / store.GrantsPerSec,
			}
			if runs[0].CyclesPerSec > 0 {
				rep.VsFewest = runs[i].CyclesPerSec / runs[0].CyclesPerSec
			}
			cells[i].Reps = append(cells[i].Reps, rep)
		}
	}
	for i := range cells {
		cells[i].Summarize()
	}
	return cells, nil
}

// serviceSummary is a service run in one line.
func serviceSummary(r report.ServiceRun) string {
	s := fmt.Sprintf("%.0f cycles/s, allocate p50 %.2fms p99 %.2fms, %d of %d allocates 200",
		r.CyclesPerSec, r.AllocateLatency.P50, r.AllocateLatency.P99, r.AllocateStatus["200"], r.AllocateCalls)
	if r.Conflicts != nil && r.Cycles > 0 {
		s += fmt.Sprintf(", %.2f conflicts/cycle", float64(*r.Conflicts)/float64(r.Cycles))
	}
	if !r.Audit.OK() {
		s += ", OVERSOLD"
	}
	return s
}
