// Command credpool leases rate-limited upstream credentials.
//
//	credpool serve [flags]   run the HTTP service
//	credpool bench [flags]   compare the lease stores under contention
//	credpool keys …          list, get, put, delete, clear-leases, import keys
//	credpool aliases set …   set a model alias
//
// Run "credpool serve -h" for the flags; each but --dev and --demo has an
// environment fallback.
// "credpool bench -h" lists the benchmark's.
package main

import (
	"fmt"
	"os"
)

const usage = `usage: credpool <command> [flags]

commands:
  serve   run the allocation service (HTTP)
  bench   benchmark the lease stores (WATCH/MULTI, Lua, SQLite) under contention
  keys    list, get, put, delete, clear-leases or import keys (admin API)
  aliases set a model alias (admin API)

Run "credpool <command> -h" for its flags.
`

func main() {
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
		os.Exit(1)
	}
}
