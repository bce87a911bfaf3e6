# credpool: `make test` is what CI runs (through .ci/run).
GO ?= go

.PHONY: test vet lint fmt run build redis-server postgresql bench bench-cpu

## test: vet, then every test under the race detector against a real
## redis-server and PostgreSQL
test: redis-server postgresql vet
	$(GO) test -race -count=1 ./...

vet:
	$(GO) vet ./...

## lint: gofmt, go vet and staticcheck must be clean
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint: vet
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) run $(STATICCHECK) ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

build:
	$(GO) build -o credpool ./cmd/credpool

## run: serve the API on 127.0.0.1:8080 with a demo pool; leases in SQLite
## unless CREDPOOL_REDIS_URL is set. Keys are generated and printed.
RUN_DB ?= credpool-demo.db
run:
	$(GO) run ./cmd/credpool serve --dev --demo --db $(RUN_DB)

## bench: the standard benchmark suite into bench/results: the Redis stores
## with and without the per-key gate (optimistic, optimistic-nogate, lua,
## lua+gate), closed loop, 64 callers, four scenarios, limits 1 and 5, 1 and
## 4 processes, pauses of 1ms and 5ms after "no slot", 4 runs of 3s per
## cell (512 runs, about 28 minutes); then an open loop at fixed rates with
## SQLite too (120 runs of 2s, about 5 minutes) into bench/results/open; then
## credpool serve against its lease store (SQLite, Redis) into
## bench/results/service, and 1 and 3 serve instances on one PostgreSQL
## catalog (10 runs each) into bench/results/service-postgres, and the same
## with a catalog each (the control) into bench/results/service-postgres-each;
## then retrying against
## waiting callers (-callers retry,wait: in line for a slot up to 10s) on
## the optimistic store, hot and identical, limits 1 and 5, 1 and 4
## processes, 4 runs of 10s per cell (96 runs, about 17 minutes) into
## bench/results/wait. About an hour in all on 2 cores. Starts its own
## redis-server and PostgreSQL on loopback.
BENCH_OUT ?= bench/results
bench: redis-server postgresql build
	./credpool bench -out $(BENCH_OUT)
	./credpool bench -strategies optimistic,optimistic-nogate,lua,lua+gate,sqlite -scenarios uniform,zipf,hot \
		-workers 64 -limits 5 -procs 1 -rates 1000,4000 -duration 2s -out $(BENCH_OUT)/open
	./credpool bench -service -out $(BENCH_OUT)/service
	./credpool bench -service -catalog postgres -instances 1,3 -strategies optimistic -reps 10 -out $(BENCH_OUT)/service-postgres
	./credpool bench -service -catalog postgres -catalog-each -instances 1,3 -strategies optimistic -reps 10 \
		-out $(BENCH_OUT)/service-postgres-each
	./credpool bench -callers retry,wait -strategies optimistic -scenarios hot,identical -workers 64 -limits 1,5 -procs 1,4 \
		-duration 10s -out $(BENCH_OUT)/wait

## bench-cpu: where the CPU of a grant goes (README): BenchmarkAllocateRelease's
## spread op on optimistic, lua+gate, lua and the bare WATCH/MULTI loop, with
## each side's CPU and the round trips per op, 6 runs of 4s each, the order
## reversed every other run (about 3 minutes).
BENCH_CPU_RUNS ?= 6
bench-cpu: redis-server
	$(GO) test -c -o bench.test ./bench/
	@for i in $$(seq $(BENCH_CPU_RUNS)); do \
		order='optimistic lua\+gate lua watch-multi-bare'; \
		[ $$((i % 2)) -eq 0 ] && order='watch-multi-bare lua lua\+gate optimistic'; \
		for s in $$order; do \
			./bench.test -test.run '^$$' -test.bench "AllocateRelease/^$$s\$$/^spread\$$" -test.benchtime 4s -test.benchmem \
				| grep '^Benchmark' || exit 1; \
		done; \
	done

## redis-server: the tests start their own servers; install the binary if missing.
## A REDIS_SERVER that is set must name an executable (a path, or a name on PATH).
redis-server:
	@if [ -n "$$REDIS_SERVER" ]; then \
		bin=$$(command -v "$$REDIS_SERVER" 2>/dev/null); \
		if [ -n "$$bin" ] && [ -f "$$bin" ] && [ -x "$$bin" ]; then exit 0; fi; \
		echo "REDIS_SERVER=$$REDIS_SERVER is not an executable redis-server."; \
		echo "Point it at one, or unset it to use (or install) the one on PATH."; \
		exit 1; \
	fi; \
	if command -v redis-server >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "redis-server missing: installing it with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; \
	else \
		echo "redis-server is missing and cannot be installed here."; \
		echo "Install it (Debian/Ubuntu: sudo apt-get install -y redis-server; macOS: brew install redis),"; \
		echo "or set REDIS_SERVER to its path."; \
		exit 1; \
	fi

## postgresql: the catalog's tests start their own PostgreSQL server; install
## initdb and postgres if missing (PG_BIN may name the directory holding them).
postgresql:
	@if [ -n "$$PG_BIN" ]; then \
		if [ -x "$$PG_BIN/initdb" ] && [ -x "$$PG_BIN/postgres" ]; then exit 0; fi; \
		echo "PG_BIN=$$PG_BIN holds no initdb and postgres."; \
		exit 1; \
	fi; \
	if command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "PostgreSQL missing: installing it with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; \
	else \
		echo "PostgreSQL's server is missing and cannot be installed here."; \
		echo "Install it (Debian/Ubuntu: sudo apt-get install -y postgresql; macOS: brew install postgresql),"; \
		echo "or set PG_BIN to the directory holding initdb and postgres."; \
		exit 1; \
	fi
