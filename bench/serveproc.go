package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

const (
	// serveStartTimeout bounds a serve process's start, until /readyz
	// answers ok.
	serveStartTimeout = 30 * time.Second
	// serveStopTimeout bounds its exit after SIGTERM (it drains requests
	// for up to 15 s, then closes in 5 s of its own) before it is killed.
	serveStopTimeout = 25 * time.Second
	// httpTimeout bounds one request to it; the service's own request
	// deadline is 10 s.
	httpTimeout = 30 * time.Second
)

// service is one "credpool serve" process on loopback, with its log in a
// temp directory of its own, and the HTTP client that drives it. Its
// methods are safe for concurrent use, but stop is called once.
type service struct {
	cmd    *exec.Cmd
	dir    string
	log    *os.File
	exited chan struct{}
	err    error // the process's exit; read after exited is closed

	base            string // http://127.0.0.1:port
	internal, admin string
	client          *http.Client
	transport       *http.Transport
	dials           atomic.Int64
}

// serveOptions is how the harness starts credpool serve. The instances of
// one run get the same, so that they share the catalog, the lease store
// and the keys.
type serveOptions struct {
	// argv is the command line of "credpool serve"; env is added to this
	// process's environment minus every CREDPOOL_ variable, so that only
	// the harness configures it.
	argv, env []string
	// db is the catalog: a SQLite file or a PostgreSQL URL.
	db string
	// redisURL holds the leases (a cluster's if cluster is set); empty
	// keeps them in the SQLite catalog's file.
	redisURL string
	cluster  bool
	// internal and admin are the API keys, secret the CREDPOOL_SECRET_KEY
	// that seals the catalog's credentials.
	internal, admin, secret string
}

// startService runs credpool serve as o says, listening on a free
// loopback port, and returns once /readyz says ok.
func startService(ctx context.Context, o serveOptions) (_ *service, err error) {
	dir, err := os.MkdirTemp("", "credpool-bench-serve-")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	s := &service{dir: dir, internal: o.internal, admin: o.admin, exited: make(chan struct{})}
	defer func() {
		if err != nil {
			_ = s.stop() // err says what went wrong
		}
	}()
	if s.log, err = os.Create(filepath.Join(dir, "serve.log")); err != nil {
		return s, fmt.Errorf("bench: %w", err)
	}
	// In the environment: a URL may carry a password, and flags show in ps.
	vars := []string{"CREDPOOL_INTERNAL_KEY=" + o.internal, "CREDPOOL_ADMIN_KEY=" + o.admin, "CREDPOOL_SECRET_KEY=" + o.secret,
		"CREDPOOL_DB=" + o.db}
	if o.redisURL != "" {
		vars = append(vars, "CREDPOOL_REDIS_URL="+o.redisURL)
		if o.cluster {
			vars = append(vars, "CREDPOOL_REDIS_CLUSTER=true")
		}
	}
	args := append(append([]string{}, o.argv[1:]...), "--listen", "127.0.0.1:0")
	s.cmd = exec.Command(o.argv[0], args...)
	s.cmd.Env = append(append(withoutCredpoolVars(os.Environ()), o.env...), vars...)
	// Request logs go to a file: the harness spends no CPU on them.
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	dieWithParent(s.cmd)
	if err := s.cmd.Start(); err != nil {
		return s, fmt.Errorf("bench: start %s: %w", o.argv[0], err)
	}
	go func() {
		s.err = s.cmd.Wait()
		close(s.exited)
	}()
	s.transport = &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			s.dials.Add(1)
			return (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
		},
		IdleConnTimeout:    90 * time.Second,
		DisableCompression: true,
	}
	s.client = &http.Client{Transport: s.transport, Timeout: httpTimeout}
	ctx, cancel := context.WithTimeout(ctx, serveStartTimeout)
	defer cancel()
	addr, err := s.waitAddr(ctx)
	if err != nil {
		return s, err
	}
	s.base = "http://" + addr
	return s, s.waitReady(ctx)
}

// withoutCredpoolVars drops the CREDPOOL_ variables from env.
func withoutCredpoolVars(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "CREDPOOL_") {
			out = append(out, kv)
		}
	}
	return out
}

// randomHex is an API key: 24 random bytes in hex.
func randomHex() string {
	return hex.EncodeToString(randomBytes(24))
}

// secretKey is a CREDPOOL_SECRET_KEY: 32 random bytes in base64.
func secretKey() string {
	return base64.StdEncoding.EncodeToString(randomBytes(32))
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return b
}

// waitAddr reads the serving address from the process's "credpool
// serving" log line.
func (s *service) waitAddr(ctx context.Context) (string, error) {
	for {
		b, err := os.ReadFile(s.log.Name())
		if err != nil {
			return "", fmt.Errorf("bench: %w", err)
		}
		for line := range bytes.Lines(b) {
			var rec struct{ Msg, Addr string }
			if json.Unmarshal(line, &rec) == nil && rec.Msg == "credpool serving" && rec.Addr != "" {
				return rec.Addr, nil
			}
		}
		if err := s.pause(ctx); err != nil {
			return "", err
		}
	}
}

// waitReady polls /readyz until it answers 200.
func (s *service) waitReady(ctx context.Context) error {
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.base+"/readyz", nil)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		if resp, err := s.client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if err := s.pause(ctx); err != nil {
			return err
		}
	}
}

// pause waits a moment between polls, failing if the process exited or
// ctx ended.
func (s *service) pause(ctx context.Context) error {
	select {
	case <-s.exited:
		return s.failed(fmt.Errorf("exited at start: %v", s.err))
	case <-ctx.Done():
		return s.failed(fmt.Errorf("not ready: %w", ctx.Err()))
	case <-time.After(20 * time.Millisecond):
		return nil
	}
}

// failed describes a failure of the service with the end of its log.
func (s *service) failed(err error) error {
	tail := ""
	if b, rerr := os.ReadFile(s.log.Name()); rerr == nil {
		tail = lastLines(string(b), 5)
	}
	return fmt.Errorf("bench: credpool serve: %w (log: %s)", err, tail)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

// stop sends SIGTERM and waits for a clean exit, killing the process if
// it takes longer than serveStopTimeout; then it removes the temp
// directory. It returns an error if the exit was not clean.
func (s *service) stop() error {
	var err error
	if s.cmd != nil && s.cmd.Process != nil {
		if s.transport != nil {
			s.transport.CloseIdleConnections()
		}
		select {
		case <-s.exited:
		default:
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-s.exited:
			case <-time.After(serveStopTimeout):
				_ = s.cmd.Process.Kill()
				<-s.exited
				err = s.failed(fmt.Errorf("still running %v after SIGTERM: killed", serveStopTimeout))
			}
		}
		if err == nil && s.err != nil {
			err = s.failed(fmt.Errorf("exit: %w", s.err))
		}
	}
	if s.log != nil {
		_ = s.log.Close()
	}
	if rerr := os.RemoveAll(s.dir); rerr != nil {
		err = errors.Join(err, fmt.Errorf("bench: %w", rerr))
	}
	return err
}

// do sends a request with a JSON body (nil: none) and the key header (an
// empty header: none), and returns the status and the answer's body.
func (s *service) do(ctx context.Context, method, path, header, key string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, s.base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if header != "" {
		req.Header.Set(header, key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

// conflicts reads the service's count of allocation attempts that lost a
// race (credpool_allocate_conflicts_total) from its metrics.
func (s *service) conflicts(ctx context.Context) (int64, error) {
	const name = "credpool_allocate_conflicts_total"
	code, out, err := s.do(ctx, http.MethodGet, "/metrics", "", "", nil)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("%d", code)
	}
	var fams map[string]*dto.MetricFamily
	if err == nil {
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err = parser.TextToMetricFamilies(bytes.NewReader(out))
	}
	if err == nil && len(fams[name].GetMetric()) != 1 {
		err = fmt.Errorf("no %s", name)
	}
	if err != nil {
		return 0, fmt.Errorf("bench: read metrics: %w", err)
	}
	return int64(fams[name].GetMetric()[0].GetCounter().GetValue()), nil
}

// call is do on the internal API.
func (s *service) call(ctx context.Context, path string, body []byte) (int, []byte, error) {
	return s.do(ctx, http.MethodPost, "/api/internal/"+path, "X-Internal-Key", s.internal, body)
}

// adminCall is do on the admin API; anything but 200 is an error.
func (s *service) adminCall(ctx context.Context, method, path string, body any) error {
	var raw []byte
	if body != nil {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return err
		}
	}
	code, out, err := s.do(ctx, method, "/api/admin/"+path, "X-Admin-Key", s.admin, raw)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("%d %s", code, bytes.TrimSpace(out))
	}
	if err != nil {
		return fmt.Errorf("bench: %s /api/admin/%s: %w", method, path, err)
	}
	return nil
}
