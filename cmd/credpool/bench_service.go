package main

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/credpool/credpool/bench"
)

// The service benchmark's defaults, for the flags not given.
const (
	serviceStrategies = "sqlite,optimistic"
	serviceWorkers    = "64"
	serviceLimits     = "5"
	serviceKeys       = 20
	serviceDuration   = 3 * time.Second
)

// servicePostgresStrategies are -service's default lease stores with
// -catalog postgres or -catalog-each: the SQLite store keeps its leases
// in the catalog, so it cannot run on PostgreSQL, nor share leases
// between catalogs.
const servicePostgresStrategies = "optimistic"

// serviceFlags are the harness flags' values as -service reads them.
type serviceFlags struct {
	strategies, workers, limits, procs, rates string
	keys                                      int
	duration, ttl, pause                      time.Duration
	// suite carries -redis, -allow-remote, -out and -seed.
	suite bench.Config
}

// notForService are the harness flags that mean nothing to -service: its
// callers list every key, allocate and report at once.
var notForService = []string{"scenarios", "candidates", "hold", "hold-dist", "ops", "crash"}

// parseService fills cfg from the flags; set names those given. -catalog
// and -instances are in cfg already.
func parseService(cfg *bench.ServiceConfig, set map[string]bool, f serviceFlags) error {
	for _, name := range notForService {
		if set[name] {
			return fmt.Errorf("bench: -%s does not apply to -service (its callers list every key and report at once)", name)
		}
	}
	procs, err := parseInts("procs", f.procs)
	if err != nil {
		return err
	}
	if set["procs"] && slices.ContainsFunc(procs, func(n int) bool { return n != 1 }) {
		return errors.New("bench: -service runs its callers in one process: -procs must be 1")
	}
	rates, err := parseFloats("rates", f.rates)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(rates, func(r float64) bool { return r != 0 }) {
		return errors.New("bench: -service is a closed loop: -rates must be 0")
	}
	if !set["strategies"] {
		f.strategies = serviceStrategies
		if cfg.Catalog == bench.CatalogPostgres || cfg.CatalogEach {
			f.strategies = servicePostgresStrategies
		}
	}
	if !set["workers"] {
		f.workers = serviceWorkers
	}
	if !set["limits"] {
		f.limits = serviceLimits
	}
	if !set["keys"] {
		f.keys = serviceKeys
	}
	if !set["duration"] {
		f.duration = serviceDuration
	}
	if cfg.Strategies, err = bench.Select(bench.Strategies(), f.strategies); err != nil {
		return err
	}
	if cfg.Workers, err = parseInts("workers", f.workers); err != nil {
		return err
	}
	if cfg.Limits, err = parseInts("limits", f.limits); err != nil {
		return err
	}
	cfg.Keys, cfg.Duration, cfg.TTL, cfg.Pause = f.keys, f.duration, f.ttl, f.pause
	cfg.RedisURL, cfg.RedisCluster, cfg.AllowRemote = f.suite.RedisURL, f.suite.RedisCluster, f.suite.AllowRemote
	cfg.OutDir, cfg.Seed = f.suite.OutDir, f.suite.Seed
	return cfg.Validate()
}
