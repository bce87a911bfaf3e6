// Command credpool leases rate-limited upstream credentials.
//
//	credpool serve [flags]   run the HTTP service
//	credpool bench [flags]   compare the lease stores under contention
//	credpool keys …          list, get, put, update, delete, clear-leases, import keys
//	credpool aliases …       list, set, delete model aliases
//
// Run "credpool serve -h" for the flags; each but --dev and --demo has an
// environment fallback.
// "credpool bench -h" lists the benchmark's.
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
)

const usage = `usage: credpool <command> [flags]

commands:
  serve   run the allocation service (HTTP)
  bench   benchmark the lease stores (WATCH/MULTI, Lua, SQLite) under contention
  keys    list, get, put, update, delete, clear-leases or import keys (admin API)
  aliases list, set or delete model aliases (admin API)

Run "credpool <command> -h" for its flags.
`

// gcPercent is credpool's GOGC unless the environment sets one. Its live
// heap is small (serving 20 keys, about 7 MB: the catalog snapshot and
// connection buffers), so at Go's default of 100 serve collected every
// 8 MB it allocated, about 30 times a second under the service benchmark,
// and collecting (marking, and the assists it charges allocations) took
// 13% of its CPU. At 400 the heap grows to five times the live data before
// a collection (about 36 MB there, against 15).
const gcPercent = 400

// tuneGC sets gcPercent unless GOGC is set, which wins as it does for any
// Go program (empty counts as unset, as for the runtime). It applies to
// every command: the benchmark then measures the lease store alone at the
// same setting as the service it compares with it.
func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
}

func main() {
	tuneGC()
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "bench":
		err = runBench(os.Args[2:])
	case "keys", "aliases":
		err = runAdmin(os.Args[1], os.Args[2:])
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "credpool: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "credpool:", err)
		// An admin command a signal stopped exits as the signal would
		// have killed it (130 for SIGINT), having said what it left.
		var stopped *interrupted
		if errors.As(err, &stopped) {
			os.Exit(stopped.exitCode())
		}
		os.Exit(1)
	}
}
