package client_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/credpool/credpool/client"
	"github.com/credpool/credpool/test/openapitest"
)

// Keys of the services under test.
const (
	internalKey = "client-test-internal-key"
	adminKey    = "client-test-admin-key-0"
	// secretKey seals the catalog's secrets: 32 bytes, base64.
	secretKey = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
	// startTimeout bounds a service's start, build excluded.
	startTimeout = 30 * time.Second
)

// serveBin is credpool built for these tests.
var serveBin string

// plain is http.DefaultTransport as the tests found it, before run made
// the default one validate.
var plain = http.DefaultTransport

// TestMain builds credpool, starts one "credpool serve" for the examples
// (its address and keys in the environment, as a deployment would give
// them), and runs the tests.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// Every exchange of a client built with nil Options (the examples) is
	// checked against the OpenAPI document; the tests' own clients are
	// given a validating Options.HTTPClient (see clients).
	http.DefaultTransport = openapitest.Transport(plain)
	dir, err := os.MkdirTemp("", "credpool-client-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	serveBin = filepath.Join(dir, "credpool")
	gobin, err := exec.LookPath("go")
	if err != nil {
		fmt.Fprintln(os.Stderr, "the tests build credpool with the go command:", err)
		return 1
	}
	build := exec.Command(gobin, "build", "-o", serveBin, "github.com/credpool/credpool/cmd/credpool")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build credpool: %v\n%s", err, out)
		return 1
	}
	svc, err := startService(filepath.Join(dir, "examples.db"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer svc.stop()
	if err := seedExamples(svc.url); err != nil {
		fmt.Fprintln(os.Stderr, "seed the examples' service:", err)
		return 1
	}
	os.Setenv("CREDPOOL_URL", svc.url)
	os.Setenv("CREDPOOL_INTERNAL_KEY", internalKey)
	os.Setenv("CREDPOOL_ADMIN_KEY", adminKey)
	return m.Run()
}

// seedExamples puts the keys the examples lease.
func seedExamples(url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	adm, err := client.NewAdmin(url, adminKey, nil)
	if err != nil {
		return err
	}
	_, err = adm.PutKey(ctx, "example-1", client.KeySpec{
		Provider: "openai", Pool: "default", Models: []string{"gpt-4o-2024-08-06"},
		Secret: "sk-example-1", MaxConcurrentUses: 8,
	})
	if err != nil {
		return err
	}
	return adm.SetAlias(ctx, "openai", "gpt-4o", "gpt-4o-2024-08-06")
}

// service is "credpool serve" as a child process on SQLite.
type service struct {
	cmd    *exec.Cmd
	url    string
	exited chan struct{}
}

// startService runs credpool serve on a free loopback port with the
// catalog (and the leases) in db, and waits for its "serving" line.
func startService(db string) (*service, error) {
	cmd := exec.Command(serveBin, "serve", "--listen", "127.0.0.1:0", "--db", db, "--max-lease", "10m")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CREDPOOL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "CREDPOOL_INTERNAL_KEY="+internalKey, "CREDPOOL_ADMIN_KEY="+adminKey, "CREDPOOL_SECRET_KEY="+secretKey)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &service{cmd: cmd, exited: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stderr)
		for lines.Scan() {
			var rec map[string]any
			if json.Unmarshal(lines.Bytes(), &rec) == nil && rec["msg"] == "credpool serving" {
				a, _ := rec["addr"].(string)
				addr <- a
				break
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
		close(s.exited)
	}()
	select {
	case a := <-addr:
		s.url = "http://" + a
		return s, nil
	case <-s.exited:
		return nil, errors.New("credpool serve exited before serving")
	case <-time.After(startTimeout):
		s.stop()
		return nil, errors.New("credpool serve did not start in time")
	}
}

// stop kills the process (also one that is stopped) and waits for it.
func (s *service) stop() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// freeze stops the process without closing its sockets: connections are
// accepted by the kernel and never answered, as from a host gone silent.
func (s *service) freeze() error { return s.cmd.Process.Signal(syscall.SIGSTOP) }

// start runs a service of the test's own, stopped when the test ends.
func start(t *testing.T) *service {
	t.Helper()
	s, err := startService(filepath.Join(t.TempDir(), "credpool.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	return s
}
