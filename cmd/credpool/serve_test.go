package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/test/pgtest"
	"github.com/credpool/credpool/test/redistest"
)

// TestMain lets the test binary stand in for credpool: with
// CREDPOOL_TEST_MAIN=1 it runs main with the given arguments.
func TestMain(m *testing.M) {
	if os.Getenv("CREDPOOL_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(pgtest.Main(m))
}

func TestParseWeights(t *testing.T) {
	w, err := parseWeights("capacity=2, jitter=0 ,rate_limit=0.7")
	require.NoError(t, err)
	want := broker.DefaultWeights()
	want.Capacity, want.Jitter, want.RateLimit = 2, 0, 0.7
	require.Equal(t, want, w)
	for _, bad := range []string{"capacity", "speed=1", "idle=-1", "idle=x", "capacity=NaN", "idle=+Inf", "idle=inf"} {
		_, err := parseWeights(bad)
		require.Error(t, err, bad)
	}
}

func TestParsePoolOrder(t *testing.T) {
	o, err := parsePoolOrder("vip=default; gold=silver+default")
	require.NoError(t, err)
	require.Equal(t, broker.PoolOrder{"vip": {"default"}, "gold": {"silver", "default"}}, o)
	for _, bad := range []string{"vip", "vip=", "a/b=default", "vip=de fault"} {
		_, err := parsePoolOrder(bad)
		require.Error(t, err, bad)
	}
	// Borrowing is one-way.
	for bad, want := range map[string]string{
		"vip=vip":                              "vip → vip",
		"vip=default;default=vip":              "default → vip → default",
		"a=b;b=c;c=a":                          "a → b → c → a",
		"gold=silver+default;x=y;default=gold": "default → gold → default",
	} {
		_, err := parsePoolOrder(bad)
		require.ErrorContains(t, err, want, bad)
		require.ErrorContains(t, err, "one-way", bad)
	}
	_, err = parsePoolOrder("gold=silver+default;silver=default")
	require.NoError(t, err, "two paths to one pool are no cycle")
}

func TestServeRefusesWithoutKeys(t *testing.T) {
	t.Setenv("CREDPOOL_INTERNAL_KEY", "")
	t.Setenv("CREDPOOL_ADMIN_KEY", "")
	err := serve([]string{"--db", filepath.Join(t.TempDir(), "x.db")})
	require.ErrorContains(t, err, "no internal key")
	err = serve([]string{"--db", filepath.Join(t.TempDir(), "x.db"), "--internal-key", internalK, "--admin-key", internalK})
	require.ErrorContains(t, err, "must differ")
	err = serve([]string{"--db", filepath.Join(t.TempDir(), "x.db"), "--internal-key", "short", "--admin-key", adminK})
	require.ErrorContains(t, err, "shorter than 16")

	t.Setenv("CREDPOOL_SECRET_KEY", "")
	err = serve([]string{"--db", filepath.Join(t.TempDir(), "x.db"), "--internal-key", internalK, "--admin-key", adminK})
	require.ErrorContains(t, err, "no secret key")
	t.Setenv("CREDPOOL_SECRET_KEY", "c2hvcnQ=")
	err = serve([]string{"--db", filepath.Join(t.TempDir(), "x.db"), "--internal-key", internalK, "--admin-key", adminK})
	require.ErrorContains(t, err, "CREDPOOL_SECRET_KEY")
	require.NotContains(t, err.Error(), "c2hvcnQ=")
}

// Keys of the serve processes under test: long enough to be accepted.
const (
	internalK = "internal-key-0123456789"
	adminK    = "admin-key-0123456789"
	// secretK seals the catalog's secrets: 32 bytes, base64.
	secretK = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
)

// serveProcess is "credpool serve" running as a child process.
type serveProcess struct {
	cmd  *exec.Cmd
	addr string
	// internal is the internal key: the given one, or the one --dev printed.
	internal string
	store    string
	// started is what it logged up to its "serving" line.
	started []string
}

// startServe runs the test binary as "credpool serve args..." with env
// added, and waits for its "serving" log line.
func startServe(t *testing.T, env []string, args ...string) *serveProcess {
	t.Helper()
	p, stderr := startServeHeld(t, env, args...)
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	return p
}

// serveCommand is "credpool serve args..." on a free loopback port, as
// the test binary runs it, with only env of credpool's environment.
func serveCommand(env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], append([]string{"serve", "--listen", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(append(os.Environ(), "CREDPOOL_TEST_MAIN=1", "CREDPOOL_REDIS_URL=", "CREDPOOL_INTERNAL_KEY=", "CREDPOOL_ADMIN_KEY=", "CREDPOOL_SECRET_KEY="), env...)
	return cmd
}

// startServeHeld is startServe, but leaves the rest of stderr to the
// test: to read, to leave unread, or to close.
func startServeHeld(t *testing.T, env []string, args ...string) (*serveProcess, io.ReadCloser) {
	t.Helper()
	cmd := serveCommand(env, args...)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	p := &serveProcess{cmd: cmd}
	for _, kv := range env {
		if k, ok := strings.CutPrefix(kv, "CREDPOOL_INTERNAL_KEY="); ok {
			p.internal = k
		}
	}
	lines := bufio.NewScanner(stderr)
	var seen []string
	for p.addr == "" && lines.Scan() {
		line := lines.Text()
		seen = append(seen, line)
		if k, ok := strings.CutPrefix(line, "dev mode: generated internal key: "); ok {
			p.internal = k
		}
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "credpool serving" {
			p.addr, _ = rec["addr"].(string)
			p.store, _ = rec["lease_store"].(string)
		}
	}
	require.NotEmpty(t, p.addr, "no serving line in:\n%s", strings.Join(seen, "\n"))
	p.started = seen
	return p, stderr
}

// post sends a JSON body with a key header and decodes the answer.
func (p *serveProcess) post(t *testing.T, method, path, header, key, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+p.addr+path, bytes.NewBufferString(body))
	require.NoError(t, err)
	req.Header.Set(header, key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

func (p *serveProcess) allocate(t *testing.T, body string) (int, map[string]any) {
	return p.post(t, http.MethodPost, "/api/internal/allocate-key", "X-Internal-Key", p.internal, body)
}

// TestServeDemo runs "credpool serve --dev --demo" as a process on the
// SQLite store, allocates over HTTP, and stops it with SIGTERM.
func TestServeDemo(t *testing.T) {
	db := filepath.Join(t.TempDir(), "demo.db")
	for run := range 2 {
		// The second run finds the dev secret key the first one made, so
		// the demo's credentials still open.
		p := startServe(t, nil, "--dev", "--demo", "--db", db)
		require.NotEmpty(t, p.internal)
		require.Equal(t, "sqlite", p.store)

		code, grant := p.allocate(t, `{"provider":"openai","model":"gpt-4o","pool":"vip","lease_seconds":1}`)
		require.Equal(t, http.StatusOK, code, "run %d: %v", run, grant)
		require.Equal(t, "demo-vip-1", grant["key_id"])
		require.Equal(t, "gpt-4o-2024-08-06", grant["provider_model"])
		require.Equal(t, map[string]any{"api_key": "sk-demo-demo-vip-1"}, grant["credential"])
		seeded := slices.ContainsFunc(p.started, func(line string) bool {
			return strings.Contains(line, `"msg":"demo pool seeded","keys":3`)
		})
		require.Equal(t, run == 0, seeded, "run %d says it seeded the demo pool only when it did:\n%s", run, strings.Join(p.started, "\n"))
		stop(t, p)
		time.Sleep(1100 * time.Millisecond) // the lease ends before the next run
	}
	fi, err := os.Stat(db + ".key")
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	raw, err := os.ReadFile(db)
	require.NoError(t, err)
	require.False(t, bytes.Contains(raw, []byte("sk-demo-")), "a credential in the clear in the catalog file")
}

// stop sends SIGTERM and waits for a clean exit.
func stop(t *testing.T, p *serveProcess) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, p.exit(t, 20*time.Second), "graceful exit after SIGTERM")
}

// exit waits up to limit for the process to end, and returns how it did.
func (p *serveProcess) exit(t *testing.T, limit time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		t.Fatalf("credpool did not exit within %s", limit)
		return nil
	}
}

// Whatever reads the service's log (stderr) may stall or go away. A
// request never waits for its log line: the lines that do not fit the
// queue are counted, and the service neither hangs nor dies of SIGPIPE.
func TestServeOutlivesItsLogReader(t *testing.T) {
	env := []string{"CREDPOOL_INTERNAL_KEY=" + internalK, "CREDPOOL_ADMIN_KEY=" + adminK, "CREDPOOL_SECRET_KEY=" + secretK}
	client := &http.Client{Timeout: 5 * time.Second}
	get := func(t *testing.T, p *serveProcess, path string) string {
		t.Helper()
		resp, err := client.Get("http://" + p.addr + path)
		require.NoError(t, err, "no answer")
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return string(body)
	}
	t.Run("stalled", func(t *testing.T) {
		p, stderr := startServeHeld(t, env, "--db", filepath.Join(t.TempDir(), "c.db"))
		defer stderr.Close()
		// A line each, none read: far more than the pipe (64 KiB) and
		// the queue (logQueue lines) hold.
		for range 2 * logQueue {
			get(t, p, "/healthz")
		}
		var dropped float64
		for _, l := range strings.Split(get(t, p, "/metrics"), "\n") {
			if v, ok := strings.CutPrefix(l, "credpool_log_lines_dropped_total "); ok {
				var err error
				dropped, err = strconv.ParseFloat(v, 64)
				require.NoError(t, err)
			}
		}
		require.Positive(t, dropped, "credpool_log_lines_dropped_total")
		stop(t, p)
	})
	t.Run("gone", func(t *testing.T) {
		p, stderr := startServeHeld(t, env, "--db", filepath.Join(t.TempDir(), "c.db"))
		require.NoError(t, stderr.Close())
		for range 10 {
			get(t, p, "/healthz")
		}
		stop(t, p)
	})
}

// A second signal stops the service at once, while the first one's drain
// waits for a request in flight (one whose body is still coming: a wait
// for a slot would be answered at once).
func TestServeSecondSignalStopsAtOnce(t *testing.T) {
	env := []string{"CREDPOOL_INTERNAL_KEY=" + internalK, "CREDPOOL_ADMIN_KEY=" + adminK, "CREDPOOL_SECRET_KEY=" + secretK}
	p := startServe(t, env, "--db", filepath.Join(t.TempDir(), "c.db"), "--read-timeout", "60s", "--request-timeout", "60s")
	// Its body's last 99 bytes may take the read timeout's 60 s: the
	// drain would wait as long.
	slowBody(t, p.addr)
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
	// Well before the first signal's drain could end.
	err := p.exit(t, 10*time.Second)
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "stopped by the second signal")
}

// A SIGTERM answers the allocates waiting for a slot at once, 503
// shutting_down with a short Retry-After, not when their waits run out
// (30 s here, which the drain would wait for): the service then exits 0,
// its last log line saying it stopped, and the held lease is still the
// one lease on the key.
func TestServeStopEndsWaitsAtOnce(t *testing.T) {
	env := []string{"CREDPOOL_INTERNAL_KEY=" + internalK, "CREDPOOL_ADMIN_KEY=" + adminK, "CREDPOOL_SECRET_KEY=" + secretK}
	for _, store := range []string{"sqlite", "redis"} {
		t.Run(store, func(t *testing.T) {
			args := []string{"--db", filepath.Join(t.TempDir(), "c.db"), "--request-timeout", "60s"}
			if store == "redis" {
				args = append(args, "--redis", "redis://"+redistest.Start(t).Addr)
			}
			p, stderr := startServeHeld(t, env, args...)
			logged := readLines(stderr)
			require.Equal(t, store, p.store)
			code, out := p.post(t, http.MethodPut, "/api/admin/keys/solo-1", "X-Admin-Key", adminK,
				`{"provider":"solo","pool":"default","models":["m"],"secret":"s3cret-0123456789","max_concurrent_uses":1}`)
			require.Equal(t, http.StatusOK, code, "%v", out)
			code, held := p.allocate(t, `{"provider":"solo","model":"m","lease_seconds":300}`)
			require.Equal(t, http.StatusOK, code, "%v", held)

			type answer struct {
				status     int
				code       string
				retryAfter string
				err        error
			}
			answered := make(chan answer, 1)
			go func() {
				req, err := http.NewRequest(http.MethodPost, "http://"+p.addr+"/api/internal/allocate-key",
					strings.NewReader(`{"provider":"solo","model":"m","wait_ms":30000}`))
				if err != nil {
					answered <- answer{err: err}
					return
				}
				req.Header.Set("X-Internal-Key", internalK)
				resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
				if err != nil {
					answered <- answer{err: err}
					return
				}
				defer resp.Body.Close()
				var body struct {
					Error struct{ Code string } `json:"error"`
				}
				err = json.NewDecoder(resp.Body).Decode(&body)
				answered <- answer{resp.StatusCode, body.Error.Code, resp.Header.Get("Retry-After"), err}
			}()
			require.Eventually(t, func() bool { return p.metric(t, "credpool_allocate_waiting") == 1 },
				20*time.Second, 10*time.Millisecond, "the allocate never waited")

			require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
			var a answer
			select {
			case a = <-answered:
			case <-time.After(20 * time.Second):
				t.Fatal("the waiting allocate is still waiting after SIGTERM: it runs out its 30 s wait")
			}
			require.NoError(t, a.err)
			require.Equal(t, http.StatusServiceUnavailable, a.status, "not 429: the pool is no fuller than before")
			require.Equal(t, "shutting_down", a.code)
			require.Equal(t, "1", a.retryAfter)
			require.NoError(t, p.exit(t, 20*time.Second), "exit 0 after SIGTERM")

			lines := <-logged
			require.NotEmpty(t, lines)
			require.Contains(t, lines[len(lines)-1], `"msg":"credpool stopped","signal":"SIGTERM"`, "the last line:\n%s", strings.Join(lines, "\n"))
			require.True(t, slices.ContainsFunc(lines, func(l string) bool {
				return strings.Contains(l, `"error_code":"shutting_down"`)
			}), "the waiting allocate's line")
			for _, l := range lines {
				require.NotContains(t, l, "s3cret", "a secret in the log")
			}

			// The held lease is still the key's one lease: the waiter cut
			// short took no slot, and none was lost.
			again := startServe(t, env, args...)
			code, view := again.post(t, http.MethodGet, "/api/admin/keys/solo-1", "X-Admin-Key", adminK, "")
			require.Equal(t, http.StatusOK, code, "%v", view)
			require.Equal(t, float64(1), view["live_leases"])
			rel, _ := json.Marshal(map[string]any{"provider": "solo", "pool": "default", "key_id": held["key_id"], "lease_id": held["lease_id"]})
			code, out = again.post(t, http.MethodPost, "/api/internal/release", "X-Internal-Key", internalK, string(rel))
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, true, out["released"], "the holder's lease outlived the stop")
			stop(t, again)
		})
	}
}

// A signal while the service starts (here: its Redis does not answer, and
// the URL lets the client retry for minutes) stops it as a signal stops
// it once serving: exit 0, saying so, without ever serving.
func TestServeStopsCleanlyWhileStarting(t *testing.T) {
	env := []string{"CREDPOOL_INTERNAL_KEY=" + internalK, "CREDPOOL_ADMIN_KEY=" + adminK, "CREDPOOL_SECRET_KEY=" + secretK}
	proxy := redistest.NewProxy(t, redistest.Start(t).Addr)
	proxy.SetBlackhole(true)
	cmd := serveCommand(env, "--db", filepath.Join(t.TempDir(), "c.db"), "--redis", "redis://"+proxy.Addr+"/0?max_retries=300")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	logged := readLines(stderr)
	require.Eventually(t, func() bool { return proxy.Conns() > 0 }, 30*time.Second, 5*time.Millisecond,
		"credpool serve never dialled its Redis")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	p := &serveProcess{cmd: cmd}
	err = p.exit(t, 30*time.Second)
	lines := <-logged
	require.NoError(t, err, "exit 0 after SIGTERM:\n%s", strings.Join(lines, "\n"))
	require.NotEmpty(t, lines)
	require.Contains(t, lines[len(lines)-1], `"msg":"credpool stopped","signal":"SIGTERM"`, "the last line:\n%s", strings.Join(lines, "\n"))
	require.True(t, slices.ContainsFunc(lines, func(l string) bool {
		return strings.Contains(l, `"msg":"stopped while starting: not serving","signal":"SIGTERM","during":"redis at --redis`)
	}), "says it stopped while starting, and what the start waited on:\n%s", strings.Join(lines, "\n"))
	for _, l := range lines {
		require.NotContains(t, l, "credpool serving")
		require.NotContains(t, l, "credpool: ", "no error")
	}
}

// readLines reads r to its end in the background and then sends its
// lines.
func readLines(r io.Reader) <-chan []string {
	out := make(chan []string, 1)
	go func() {
		var lines []string
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		out <- lines
	}()
	return out
}

// metric reads one unlabelled metric of /metrics.
func (p *serveProcess) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return f
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}

// The drain at shutdown lasts at least as long as a request may.
func TestDrainOutlastsARequest(t *testing.T) {
	require.Equal(t, drainTimeout, drainFor(time.Second))
	require.Equal(t, 60*time.Second+closeTimeout, drainFor(time.Minute))
}

// Two "credpool serve" processes on one SQLite file share catalog and
// leases: concurrent allocates through both on a limit-1 key give exactly
// one holder.
func TestTwoServersShareOneSQLiteFile(t *testing.T) {
	db := filepath.Join(t.TempDir(), "shared.db")
	env := []string{"CREDPOOL_INTERNAL_KEY=" + internalK, "CREDPOOL_ADMIN_KEY=" + adminK, "CREDPOOL_SECRET_KEY=" + secretK}
	a := startServe(t, env, "--db", db)
	b := startServe(t, env, "--db", db)
	code, out := a.post(t, http.MethodPut, "/api/admin/keys/solo-1", "X-Admin-Key", adminK,
		`{"provider":"solo","pool":"default","models":["m"],"secret":"s3cret","max_concurrent_uses":1}`)
	require.Equal(t, http.StatusOK, code, "%v", out)

	const body = `{"provider":"solo","model":"m","lease_seconds":60}`
	codes := make(chan int, 32)
	grants := make(chan map[string]any, 32)
	var wg sync.WaitGroup
	for i := range 32 {
		srv := []*serveProcess{a, b}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, "http://"+srv.addr+"/api/internal/allocate-key", bytes.NewBufferString(body))
			req.Header.Set("X-Internal-Key", internalK)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				codes <- -1
				return
			}
			defer resp.Body.Close()
			var out map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&out)
			codes <- resp.StatusCode
			if resp.StatusCode == http.StatusOK {
				grants <- out
			}
		}()
	}
	wg.Wait()
	close(codes)
	close(grants)
	count := map[int]int{}
	for c := range codes {
		count[c]++
	}
	require.Equal(t, map[int]int{http.StatusOK: 1, http.StatusTooManyRequests: 31}, count)

	// Released through one server, the slot is free through the other.
	g := <-grants
	rel, _ := json.Marshal(map[string]any{"provider": "solo", "pool": "default", "key_id": g["key_id"], "lease_id": g["lease_id"]})
	code, out = b.post(t, http.MethodPost, "/api/internal/release", "X-Internal-Key", internalK, string(rel))
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, true, out["released"])
	code, _ = a.allocate(t, body)
	require.Equal(t, http.StatusOK, code)
}

// Two "credpool serve" processes on one PostgreSQL catalog and one Redis,
// as on two hosts: a key put through one is served by both, a limit-1 key
// has one holder across both, and a key disabled through one is never
// granted by the other afterwards.
func TestTwoServersSharePostgres(t *testing.T) {
	pg := pgtest.URL(t)
	redis := "redis://" + redistest.Start(t).Addr
	env := []string{"CREDPOOL_INTERNAL_KEY=" + internalK, "CREDPOOL_ADMIN_KEY=" + adminK, "CREDPOOL_SECRET_KEY=" + secretK}
	a := startServe(t, env, "--db", pg, "--redis", redis)
	b := startServe(t, env, "--db", pg, "--redis", redis)
	require.Equal(t, "redis", b.store)
	code, out := a.post(t, http.MethodPut, "/api/admin/keys/solo-1", "X-Admin-Key", adminK,
		`{"provider":"solo","pool":"default","models":["m"],"secret":"s3cret","max_concurrent_uses":1}`)
	require.Equal(t, http.StatusOK, code, "%v", out)

	const body = `{"provider":"solo","model":"m","lease_seconds":60}`
	code, g := b.allocate(t, body)
	require.Equal(t, http.StatusOK, code, "%v", g)
	require.Equal(t, map[string]any{"api_key": "s3cret"}, g["credential"])
	code, _ = a.allocate(t, body)
	require.Equal(t, http.StatusTooManyRequests, code, "one holder across both")
	rel, _ := json.Marshal(map[string]any{"provider": "solo", "pool": "default", "key_id": g["key_id"], "lease_id": g["lease_id"]})
	code, _ = a.post(t, http.MethodPost, "/api/internal/release", "X-Internal-Key", internalK, string(rel))
	require.Equal(t, http.StatusOK, code)

	code, out = a.post(t, http.MethodPut, "/api/admin/keys/solo-1", "X-Admin-Key", adminK,
		`{"provider":"solo","pool":"default","models":["m"],"secret":"s3cret","max_concurrent_uses":1,"status":"disabled"}`)
	require.Equal(t, http.StatusOK, code, "%v", out)
	code, out = b.allocate(t, body)
	require.Equal(t, http.StatusConflict, code, "disabled through the other instance: %v", out)
}

// A PostgreSQL catalog needs Redis for the leases, and its URL's password
// stays out of every message.
func TestServePostgresURL(t *testing.T) {
	unsetServeEnv(t)
	_, err := parseServe([]string{"--db", "postgres://u:hunter2@127.0.0.1/db"})
	require.ErrorContains(t, err, "needs --redis")

	t.Setenv("CREDPOOL_SECRET_KEY", "")
	err = serve([]string{"--dev", "--db", "postgres://u:hunter2@127.0.0.1/db", "--redis", "redis://127.0.0.1:1"})
	require.ErrorContains(t, err, "the same on every instance")

	t.Setenv("CREDPOOL_SECRET_KEY", secretK)
	err = serve([]string{"--db", "postgres://u:hunter2@127.0.0.1:1/db?connect_timeout=2", "--redis", "redis://127.0.0.1:1",
		"--internal-key", internalK, "--admin-key", adminK})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "hunter2")
}

// A --db that is neither a SQLite path nor a PostgreSQL URL is refused,
// never quoted (it may hold a password) and never taken for a file name;
// a PostgreSQL URL's scheme may be in any case.
func TestServeRefusesDBsItWouldMistake(t *testing.T) {
	unsetServeEnv(t)
	for _, db := range []string{
		"host=db.internal user=credpool password=hunter2 dbname=credpool",
		"dbname=credpool password = hunter2",
		"mysql://u:hunter2@127.0.0.1/db",
		"credpool:hunter2@db.internal:5432/credpool?sslmode=require",
		"credpool:hunter2@db.internal/credpool",
	} {
		_, err := parseServe([]string{"--db", db, "--redis", "redis://127.0.0.1:1"})
		require.ErrorContains(t, err, "--db", db)
		require.NotContains(t, err.Error(), "hunter2")
	}
	_, err := parseServe([]string{"--db", "data/credpool.db"})
	require.NoError(t, err)

	_, err = parseServe([]string{"--db", "POSTGRES://u:hunter2@127.0.0.1/db"})
	require.ErrorContains(t, err, "needs --redis", "a PostgreSQL URL")
	t.Setenv("CREDPOOL_SECRET_KEY", secretK)
	dir := t.TempDir()
	t.Chdir(dir)
	err = serve([]string{"--db", "PostgreSQL://u:hunter2@127.0.0.1:1/db?connect_timeout=2", "--redis", "redis://127.0.0.1:1",
		"--internal-key", internalK, "--admin-key", adminK})
	require.ErrorContains(t, err, "postgres:")
	require.ErrorContains(t, err, "database=db", "read as a URL (pgx reads an upper-case scheme as keywords, for a local socket)")
	require.NotContains(t, err.Error(), "hunter2")
	files, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, files, "no SQLite file made")

	_, err = parseServe([]string{"--redis-cluster"})
	require.ErrorContains(t, err, "--redis-cluster needs --redis")
}

// closedWithin reads from conn until the server closes it and says whether
// that happened before limit. Whatever the server answers first is read
// and ignored.
func closedWithin(t *testing.T, conn net.Conn, limit time.Duration) bool {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(limit)))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return true
}

// A client cannot hold a connection by sending its body slowly or by
// keeping an idle keep-alive open: the server closes both. Each case runs
// with the other timeout long, so only its own can close the connection
// (net/http falls back to the read timeout for idle connections).
func TestServeCutsSlowAndIdleClients(t *testing.T) {
	env := []string{"CREDPOOL_INTERNAL_KEY=" + internalK, "CREDPOOL_ADMIN_KEY=" + adminK, "CREDPOOL_SECRET_KEY=" + secretK}
	p := startServe(t, env, "--db", filepath.Join(t.TempDir(), "x.db"), "--read-timeout", "1s", "--idle-timeout", "60s")

	slow := slowBody(t, p.addr)
	require.True(t, closedWithin(t, slow, 20*time.Second), "a body that never ends holds the connection")

	p = startServe(t, env, "--db", filepath.Join(t.TempDir(), "y.db"), "--read-timeout", "30s", "--idle-timeout", "1s")
	idle, err := net.Dial("tcp", p.addr)
	require.NoError(t, err)
	defer idle.Close()
	_, err = fmt.Fprint(idle, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, resp.Body.Close())
	require.True(t, closedWithin(t, idle, 20*time.Second), "an idle keep-alive stays open")
}

// slowBody sends addr an allocate whose body never ends (1 of its 100
// bytes), on a connection closed when the test ends, and returns it.
func slowBody(t *testing.T, addr string) net.Conn {
	t.Helper()
	slow, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = slow.Close() })
	_, err = fmt.Fprintf(slow, "POST /api/internal/allocate-key HTTP/1.1\r\nHost: x\r\nX-Internal-Key: %s\r\nContent-Length: 100\r\n\r\n{", internalK)
	require.NoError(t, err)
	return slow
}

func TestServeRejectsBadTimeouts(t *testing.T) {
	_, err := parseServe([]string{"--read-timeout", "0s"})
	require.ErrorContains(t, err, "must be positive")
	_, err = parseServe([]string{"--request-timeout", "-1s"})
	require.ErrorContains(t, err, "--request-timeout")
	_, err = parseServe([]string{"--max-lease", "48h"})
	require.ErrorContains(t, err, "--max-lease")
	_, err = parseServe([]string{"--redis-min-replicas", "-1"})
	require.ErrorContains(t, err, "--redis-min-replicas")
	_, err = parseServe([]string{"--inspect", "-1"})
	require.ErrorContains(t, err, "--inspect")
	_, err = parseServe([]string{"--live-max-age", "-1ms"})
	require.ErrorContains(t, err, "--live-max-age")
	require.Equal(t, time.Duration(-1), liveMaxAge(0), "0 reads on every allocate")
	require.Equal(t, time.Second, liveMaxAge(time.Second))
	_, err = parseServe([]string{"--redis-cluster-refresh", "0s"})
	require.ErrorContains(t, err, "--redis-cluster-refresh")
	t.Setenv("CREDPOOL_IDLE_TIMEOUT", "soon")
	_, err = parseServe(nil)
	require.ErrorContains(t, err, "CREDPOOL_IDLE_TIMEOUT")
	require.ErrorContains(t, err, "want a duration with its unit, e.g. 10s", "a bare number is a common slip")
}

// Every flag but --dev and --demo falls back to its environment variable,
// parsed as the flag is; the command line wins.
func TestServeReadsEnv(t *testing.T) {
	unsetServeEnv(t)
	for env, v := range map[string]string{
		"CREDPOOL_LISTEN": "127.0.0.1:9", "CREDPOOL_REDIS_URL": "redis://r:6379/2", "CREDPOOL_DB": "c.db",
		"CREDPOOL_INTERNAL_KEY": "i", "CREDPOOL_ADMIN_KEY": "a", "CREDPOOL_WEIGHTS": "idle=1",
		"CREDPOOL_POOL_FALLBACK": "a=b", "CREDPOOL_READ_TIMEOUT": "3s", "CREDPOOL_IDLE_TIMEOUT": "4s", "CREDPOOL_REQUEST_TIMEOUT": "20s",
		"CREDPOOL_MAX_LEASE": "5m", "CREDPOOL_REDIS_MIN_REPLICAS": "2", "CREDPOOL_INSPECT": "8",
		"CREDPOOL_REDIS_CLUSTER_REFRESH": "3s", "CREDPOOL_LIVE_MAX_AGE": "250ms",
	} {
		t.Setenv(env, v)
	}
	c, err := parseServe(nil)
	require.NoError(t, err)
	for _, e := range serveEnv {
		if e.flag != "redis-cluster" {
			require.Equal(t, e.env+" (for --"+e.flag+")", c.name(e.flag), "errors name where the value came from")
		}
	}
	c.env = nil
	require.Equal(t, serveConfig{
		listen: "127.0.0.1:9", redisURL: "redis://r:6379/2", db: "c.db", internalKey: "i", adminKey: "a",
		weights: "idle=1", fallback: "a=b", readTimeout: 3 * time.Second, idleTimeout: 4 * time.Second, reqTimeout: 20 * time.Second,
		maxLease: 5 * time.Minute, minReplicas: 2, inspect: 8, liveMaxAge: 250 * time.Millisecond, clusterRefresh: 3 * time.Second,
	}, c)
	c, err = parseServe([]string{"--db", "flag.db", "--read-timeout", "7s"})
	require.NoError(t, err)
	require.Equal(t, "flag.db", c.db, "the command line wins")
	require.Equal(t, 7*time.Second, c.readTimeout, "the command line wins")
	require.Equal(t, "--db", c.name("db"))
	require.Equal(t, "CREDPOOL_LISTEN (for --listen)", c.name("listen"))
	t.Setenv("CREDPOOL_IDLE_TIMEOUT", "soon")
	_, err = parseServe([]string{"--idle-timeout", "4s"})
	require.NoError(t, err, "a variable the command line overrides is not read")
	t.Setenv("CREDPOOL_IDLE_TIMEOUT", "4s")

	for v, want := range map[string]bool{"true": true, "1": true, "TRUE": true, "t": true, "false": false, "0": false} {
		t.Setenv("CREDPOOL_REDIS_CLUSTER", v)
		c, err := parseServe(nil)
		require.NoError(t, err, v)
		require.Equal(t, want, c.redisCluster, "CREDPOOL_REDIS_CLUSTER=%s", v)
	}
	for _, v := range []string{"yes", ""} {
		t.Setenv("CREDPOOL_REDIS_CLUSTER", v)
		_, err = parseServe(nil)
		require.ErrorContains(t, err, "CREDPOOL_REDIS_CLUSTER", "%q is no boolean: refused, not read as false", v)
	}
}

// A value that stops the start is named where the operator set it: the
// variable when it came from the environment, else the flag.
func TestServeNamesWhereABadValueCameFrom(t *testing.T) {
	unsetServeEnv(t)
	for env, c := range map[string]struct{ value, flag, why string }{
		"CREDPOOL_MAX_LEASE":             {"48h", "max-lease", "must be from 1s"},
		"CREDPOOL_READ_TIMEOUT":          {"0s", "read-timeout", "must be positive"},
		"CREDPOOL_REDIS_CLUSTER_REFRESH": {"0s", "redis-cluster-refresh", "must be positive"},
		"CREDPOOL_INSPECT":               {"-1", "inspect", "must be 0 (all) or more"},
		"CREDPOOL_LIVE_MAX_AGE":          {"-1ms", "live-max-age", "must be 0"},
		"CREDPOOL_REDIS_MIN_REPLICAS":    {"-1", "redis-min-replicas", "must be 0 or more"},
		"CREDPOOL_DB":                    {"host=db user=credpool password=hunter2", "db", "libpq keyword"},
	} {
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, c.value)
			_, err := parseServe(nil)
			require.ErrorContains(t, err, env+" (for --"+c.flag+") ")
			require.ErrorContains(t, err, c.why)
			_, err = parseServe([]string{"--" + c.flag, c.value})
			require.ErrorContains(t, err, "serve: --"+c.flag+" ")
			require.NotContains(t, err.Error(), env, "the command line's value is the flag's")
		})
	}

	t.Setenv("CREDPOOL_SECRET_KEY", secretK)
	t.Chdir(t.TempDir())
	keys := []string{"--internal-key", internalK, "--admin-key", adminK}
	t.Setenv("CREDPOOL_WEIGHTS", "speed=1")
	require.ErrorContains(t, serve(keys), "CREDPOOL_WEIGHTS (for --weights): \"speed=1\": want name=value")
	require.ErrorContains(t, serve(append(keys, "--weights", "speed=1")), "--weights: ")
	require.NoError(t, os.Unsetenv("CREDPOOL_WEIGHTS"))
	t.Setenv("CREDPOOL_POOL_FALLBACK", "vip")
	require.ErrorContains(t, serve(keys), "CREDPOOL_POOL_FALLBACK (for --pool-fallback): \"vip\": want pool=fallback")
	require.NoError(t, os.Unsetenv("CREDPOOL_POOL_FALLBACK"))

	t.Setenv("CREDPOOL_REDIS_URL", "redis://u:hunter2@127.0.0.1:notaport/0")
	err := serve(keys)
	require.ErrorContains(t, err, "CREDPOOL_REDIS_URL (for --redis): not a valid Redis URL")
	require.NotContains(t, err.Error(), "hunter2")
	err = serve(append(keys, "--redis", "redis://u:hunter2@127.0.0.1:notaport/0"))
	require.ErrorContains(t, err, "--redis: not a valid Redis URL")
	require.NotContains(t, err.Error(), "CREDPOOL_REDIS_URL")
	t.Setenv("CREDPOOL_REDIS_URL", "redis+sentinel://u:hunter2@127.0.0.1:26379")
	err = serve(keys)
	require.ErrorContains(t, err, "CREDPOOL_REDIS_URL (for --redis): not a valid Sentinel URL")
	require.NotContains(t, err.Error(), "hunter2")
	t.Setenv("CREDPOOL_REDIS_URL", "redis://127.0.0.1:1/0")
	require.ErrorContains(t, serve(keys), "redis at CREDPOOL_REDIS_URL (for --redis) is not reachable")
}

// A Redis that answers but has no such database is reachable: the start
// says which database it lacks, not that nothing answered.
func TestServeSaysARedisHasNoSuchDatabase(t *testing.T) {
	unsetServeEnv(t)
	t.Setenv("CREDPOOL_SECRET_KEY", secretK)
	t.Chdir(t.TempDir())
	r := redistest.Start(t)
	keys := []string{"--internal-key", internalK, "--admin-key", adminK}
	err := serve(append(keys, "--redis", "redis://"+r.Addr+"/99"))
	require.ErrorContains(t, err, "redis at --redis has no database 99")
	require.ErrorContains(t, err, "ERR DB index is out of range", "Redis's own words")
	require.NotContains(t, err.Error(), "not reachable")
	t.Setenv("CREDPOOL_REDIS_URL", "redis://"+r.Addr+"/99")
	require.ErrorContains(t, serve(keys), "redis at CREDPOOL_REDIS_URL (for --redis) has no database 99")
}

// unsetServeEnv unsets serve's environment variables for the test.
func unsetServeEnv(t *testing.T) {
	for _, e := range serveEnv {
		t.Setenv(e.env, "") // restored when the test ends
		require.NoError(t, os.Unsetenv(e.env))
	}
}

// Replica acknowledgements only exist for Redis.
func TestServeRefusesMinReplicasWithoutRedis(t *testing.T) {
	unsetServeEnv(t)
	_, err := parseServe([]string{"--redis-min-replicas", "1"})
	require.ErrorContains(t, err, "--redis-min-replicas needs --redis")
	_, err = parseServe([]string{"--redis-min-replicas", "1", "--redis", "redis://127.0.0.1:6379"})
	require.NoError(t, err)
}

// An empty listen address, as an unset variable in a unit file gives, is
// refused: net.Listen would take it for every interface.
func TestServeRefusesAnEmptyListenAddress(t *testing.T) {
	unsetServeEnv(t)
	_, err := parseServe([]string{"--listen", ""})
	require.ErrorContains(t, err, "--listen is empty")
	t.Setenv("CREDPOOL_LISTEN", "")
	_, err = parseServe(nil)
	require.ErrorContains(t, err, "CREDPOOL_LISTEN (for --listen) is empty")
	_, err = parseServe([]string{"--listen", ":8080"})
	require.NoError(t, err, "every interface, said so")
}

// A secret key that opens none of the catalog's secrets (valid, but not
// the one that sealed them) stops the start with one line saying so and
// how to fix it, quoting neither key nor secret; before, the service
// started, said ready, and answered every allocate 503. The instance
// already serving the catalog is left alone, and the wrong key given with
// the right one as old (a rotation) starts and grants.
func TestServeRefusesAWrongSecretKey(t *testing.T) {
	const wrongK = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=" // 32 bytes, base64
	for _, engine := range []string{"sqlite", "postgres"} {
		t.Run(engine, func(t *testing.T) {
			args := []string{"--db", filepath.Join(t.TempDir(), "credpool.db")}
			if engine == "postgres" {
				args = []string{"--db", pgtest.URL(t), "--redis", "redis://" + redistest.Start(t).Addr}
			}
			keys := []string{"CREDPOOL_INTERNAL_KEY=" + internalK, "CREDPOOL_ADMIN_KEY=" + adminK}
			right := startServe(t, append(keys, "CREDPOOL_SECRET_KEY="+secretK), args...)
			code, out := right.post(t, http.MethodPut, "/api/admin/keys/solo-1", "X-Admin-Key", adminK,
				`{"provider":"solo","pool":"default","models":["m"],"secret":"s3cret-0123456789","max_concurrent_uses":1}`)
			require.Equal(t, http.StatusOK, code, "%v", out)

			stderr := serveFails(t, append(keys, "CREDPOOL_SECRET_KEY="+wrongK), args...)
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			last := lines[len(lines)-1]
			require.Contains(t, last, "credpool: ")
			require.Contains(t, last, "does not open the catalog's secrets")
			require.Contains(t, last, "set CREDPOOL_SECRET_KEY to the key that sealed them")
			for _, s := range []string{wrongK, secretK, "s3cret"} {
				require.NotContains(t, stderr, s)
			}
			code, _ = right.post(t, http.MethodGet, "/readyz", "X-Internal-Key", internalK, "")
			require.Equal(t, http.StatusOK, code, "the instance with the right key still serves")

			rotating := startServe(t, append(keys, "CREDPOOL_SECRET_KEY="+wrongK, "CREDPOOL_SECRET_KEYS_OLD="+secretK), args...)
			code, grant := rotating.allocate(t, `{"provider":"solo","model":"m","lease_seconds":1}`)
			require.Equal(t, http.StatusOK, code, "%v", grant)
			require.Equal(t, map[string]any{"api_key": "s3cret-0123456789"}, grant["credential"])
		})
	}
}

// In --dev mode a lost key file makes a new key, which opens none of
// the catalog's secrets: the start says which file to put back.
func TestServeDevSaysWhichKeyFileIsWrong(t *testing.T) {
	db := filepath.Join(t.TempDir(), "demo.db")
	stop(t, startServe(t, nil, "--dev", "--demo", "--db", db))
	require.NoError(t, os.Remove(db+".key"))
	stderr := serveFails(t, nil, "--dev", "--db", db)
	require.Contains(t, stderr, "does not open the catalog's secrets: the key is --dev's "+db+".key: put back the file that sealed them")
}

// serveFails runs "credpool serve args..." with env added, as startServe
// does, expects it to exit 1 before serving, and returns its stderr. One
// that serves is stopped at once; one that hangs, within 30 s.
func serveFails(t *testing.T, env []string, args ...string) string {
	t.Helper()
	cmd := serveCommand(env, args...)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	hung := time.AfterFunc(30*time.Second, func() { _ = cmd.Process.Kill() })
	defer hung.Stop()
	var seen strings.Builder
	lines := bufio.NewScanner(stderr)
	for lines.Scan() {
		seen.WriteString(lines.Text() + "\n")
		if strings.Contains(lines.Text(), `"msg":"credpool serving"`) {
			_ = cmd.Process.Kill()
		}
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, seen.String())
	require.Equal(t, 1, exit.ExitCode(), "credpool serve did not refuse to start:\n%s", seen.String())
	return seen.String()
}
