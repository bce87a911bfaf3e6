// Package bench is credpool's benchmark harness: it runs the same workloads
// against every lease store (the WATCH/MULTI store, the seed's Lua script in
// bench/baseline, SQLite) and reports goodput, conflicts, latency and Redis
// commands side by side, under an oversell audit that fails the run if any
// key ever had more holders than its limit.
//
// Run measures a list of cells (see Grid and Standard) on every strategy,
// Config.Reps times, alternating the strategies' order (every other cell
// starts with the reverse), each run in a fresh key space: a unique key
// prefix on Redis, a new file for SQLite.
// The Redis stores come with and without the per-key gate of
// internal/keygate (see Strategies), so that reports compare like with
// like. A cell with Procs > 1 runs its callers in that many OS
// processes, started with Config.Worker (credpool's own binary re-executed
// as "credpool bench -worker"), which share one holder count through a
// memory-mapped file and hand their results back as JSON on stdout.
//
// Callers of a closed loop retry (pause after "no slot", Grid.Pauses) or
// wait in line for a slot (AllocateRequest.Wait, Grid.Waits); a store
// that cannot wait skips the waiting cells, and the report names it. The
// report sets the two side by side: time to grant, grants per second,
// Redis requests per grant and the spread of grants over the callers.
//
// RunService is the service benchmark: credpool serve (ServiceConfig.Serve,
// credpool's own binary again) as a process on loopback, on SQLite or on
// Redis, driven over HTTP through allocate and report cycles, against the
// same lease store alone under the harness, in the same run. Its catalog is
// a SQLite file or a database on a throwaway PostgreSQL server, and
// several instances can share it (ServiceConfig.Instances), measured side
// by side with one.
//
// The workload itself is package workload; the outputs are package report.
package bench
