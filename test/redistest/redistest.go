// Package redistest starts throwaway redis-server processes for tests: one
// per call, on a free loopback port, in its own temporary directory, with
// persistence off. There is no fallback to a fake: if redis-server is
// missing, the test fails and says how to install it.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// InstallHint says how to get the binary; it ends every "not found" error.
const InstallHint = "install it (Debian/Ubuntu: sudo apt-get install -y redis-server; macOS: brew install redis), or set REDIS_SERVER to its path"

// Server is one running redis-server. Its methods are safe for concurrent
// use, except Stop, which must be called once.
type Server struct {
	// Addr is host:port on 127.0.0.1.
	Addr string
	// Cluster reports whether the server runs in cluster mode, owning all
	// 16384 slots.
	Cluster bool
	cmd     *exec.Cmd
	exited  chan struct{}
}

// Binary returns the redis-server path: $REDIS_SERVER, else the one on PATH.
func Binary() (string, error) {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redis-server not found on PATH: %s", InstallHint)
	}
	return p, nil
}

// Start starts a standalone server and stops it when t ends.
func Start(t testing.TB) *Server { return start(t, false) }

// StartCluster starts a one-node cluster that owns every slot, so cluster
// rules (one slot per transaction, CROSSSLOT errors) apply.
func StartCluster(t testing.TB) *Server { return start(t, true) }

func start(t testing.TB, cluster bool) *Server {
	t.Helper()
	s, err := Run(t.TempDir(), cluster)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Run starts a server with its files in dir, for callers without a
// testing.TB (TestMain, examples). The caller must Stop it.
func Run(dir string, cluster bool) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	var last error
	// A free port can be taken between probing and binding; try a few.
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s, err := launch(bin, dir, port, cluster)
		if err == nil {
			return s, nil
		}
		last = err
	}
	return nil, last
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func launch(bin, dir string, port int, cluster bool) (*Server, error) {
	args := []string{
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--logfile", "redis.log", "--protected-mode", "yes",
	}
	if cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Cluster: cluster, cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	if err := s.waitReady(dir); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func (s *Server) waitReady(dir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer rdb.Close()
	for {
		select {
		case <-s.exited:
			log, _ := os.ReadFile(dir + "/redis.log")
			return fmt.Errorf("redis-server on %s exited at start: %s", s.Addr, lastLines(string(log), 5))
		case <-ctx.Done():
			return fmt.Errorf("redis-server on %s not ready after 10s", s.Addr)
		case <-time.After(10 * time.Millisecond):
		}
		if err := rdb.Ping(ctx).Err(); err != nil {
			continue
		}
		if !s.Cluster {
			return nil
		}
		return claimSlots(ctx, rdb)
	}
}

// claimSlots gives the single node every slot and waits for the cluster to
// say ok.
func claimSlots(ctx context.Context, rdb *redis.Client) error {
	if err := rdb.Do(ctx, "cluster", "addslotsrange", 0, 16383).Err(); err != nil {
		return fmt.Errorf("cluster addslotsrange: %w", err)
	}
	for {
		info, err := rdb.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.New("cluster state not ok after 10s")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// Stop kills the server and waits for it to exit. Clients see connection
// errors from then on.
func (s *Server) Stop() {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// Client returns a client of the server, closed when t ends. For a cluster
// server it is a *redis.ClusterClient.
func (s *Server) Client(t testing.TB) redis.UniversalClient {
	t.Helper()
	var rdb redis.UniversalClient
	if s.Cluster {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{s.Addr}, DialerRetries: 1})
	} else {
		rdb = redis.NewClient(&redis.Options{Addr: s.Addr, DialerRetries: 1})
	}
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Find lists every key whose name or content (hash fields and values, set
// and list members, string value) contains needle, as "name (type)". It
// proves that something left no trace, or that a secret never reached Redis.
func (s *Server) Find(t testing.TB, needle string) []string {
	t.Helper()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rdb.Close()
	var found []string
	iter := rdb.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		name := iter.Val()
		typ, content, err := dump(ctx, rdb, name)
		if err != nil {
			t.Fatalf("redistest: read %s: %v", name, err)
		}
		if strings.Contains(name, needle) || strings.Contains(content, needle) {
			found = append(found, name+" ("+typ+")")
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("redistest: scan: %v", err)
	}
	return found
}

func dump(ctx context.Context, rdb *redis.Client, name string) (typ, content string, err error) {
	typ, err = rdb.Type(ctx, name).Result()
	if err != nil {
		return "", "", err
	}
	var parts []string
	switch typ {
	case "string":
		var v string
		v, err = rdb.Get(ctx, name).Result()
		parts = []string{v}
	case "hash":
		var m map[string]string
		m, err = rdb.HGetAll(ctx, name).Result()
		for k, v := range m {
			parts = append(parts, k, v)
		}
	case "zset":
		parts, err = rdb.ZRange(ctx, name, 0, -1).Result()
	case "set":
		parts, err = rdb.SMembers(ctx, name).Result()
	case "list":
		parts, err = rdb.LRange(ctx, name, 0, -1).Result()
	case "none":
	default:
		err = fmt.Errorf("unexpected type %s", typ)
	}
	if errors.Is(err, redis.Nil) {
		err = nil
	}
	return typ, strings.Join(parts, "\x00"), err
}
