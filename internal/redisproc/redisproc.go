// Package redisproc starts throwaway redis-server processes: one per call,
// on a free loopback port, with its files in a directory of the caller's
// and persistence off. The tests (through test/redistest) and the
// benchmark harness use it; it never links the testing package into the
// binary.
package redisproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// InstallHint says how to get the binary; it ends every "not found" error.
const InstallHint = "install it (Debian/Ubuntu: sudo apt-get install -y redis-server; macOS: brew install redis), or set REDIS_SERVER to its path"

// Server is one running redis-server. Its methods are safe for concurrent
// use.
type Server struct {
	// Addr is host:port on 127.0.0.1.
	Addr string
	// Cluster reports whether the server runs in cluster mode, owning all
	// 16384 slots.
	Cluster bool
	bin     string
	dir     string
	port    int
	extra   []string // more arguments, e.g. --replicaof
	cmd     *exec.Cmd
	exited  chan struct{}
}

// Binary returns the redis-server path: $REDIS_SERVER (a path, or a name
// looked up on PATH), else the one on PATH. Either must be an executable
// file, or the error says how to get one.
func Binary() (string, error) {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		bin, err := exec.LookPath(p)
		if err != nil {
			return "", fmt.Errorf("REDIS_SERVER=%s is not an executable redis-server (%w): %s", p, err, InstallHint)
		}
		return bin, nil
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redis-server not found on PATH: %s", InstallHint)
	}
	return bin, nil
}

// Run starts a server with its files in dir, in cluster mode owning all
// 16384 slots if cluster is set, so cluster rules (one slot per
// transaction, CROSSSLOT errors) apply. The caller must Stop it; the
// kernel kills it if the calling process dies first (Linux).
func Run(dir string, cluster bool) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	return start(bin, dir, cluster, nil, nil)
}

// start launches a server on a free port and, if then is set, waits for it
// too. A free port can be taken between probing and binding, so it tries a
// few, stopping a server that failed.
func start(bin, dir string, cluster bool, extra []string, then func(*Server) error) (*Server, error) {
	var last error
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		args := extra
		if cluster {
			if args, err = withBusPort(extra); err != nil {
				return nil, err
			}
		}
		s, err := launch(bin, dir, port, cluster, args)
		if err == nil && then != nil {
			if err = then(s); err != nil {
				s.Stop()
			}
		}
		if err == nil {
			return s, nil
		}
		last = err
	}
	return nil, last
}

// withBusPort is extra with a free cluster bus port: the default,
// port+10000, lies beyond 65535 for a port above 55535, which
// redis-server refuses.
func withBusPort(extra []string) ([]string, error) {
	bus, err := freePort()
	if err != nil {
		return nil, err
	}
	return append(slices.Clip(extra), "--cluster-port", strconv.Itoa(bus)), nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func launch(bin, dir string, port int, cluster bool, extra []string) (*Server, error) {
	args := []string{
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--logfile", "redis.log", "--protected-mode", "yes",
	}
	args = append(args, extra...)
	if cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	s := &Server{
		Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Cluster: cluster,
		bin: bin, dir: dir, port: port, extra: extra, cmd: cmd, exited: make(chan struct{}),
	}
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
		if err := s.ours(ctx, rdb); err != nil {
			return err
		}
		if !s.Cluster {
			return nil
		}
		return claimSlots(ctx, rdb)
	}
}

// ours checks that the server answering on s's port is s's process, not
// another one that held the port first (ours then fails to bind and exits).
func (s *Server) ours(ctx context.Context, rdb *redis.Client) error {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return fmt.Errorf("redis-server on %s: info: %w", s.Addr, err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			if v == strconv.Itoa(s.cmd.Process.Pid) {
				return nil
			}
			return fmt.Errorf("%s is answered by another redis-server (pid %s), not the one started (pid %d)", s.Addr, v, s.cmd.Process.Pid)
		}
	}
	return fmt.Errorf("redis-server on %s: info server has no process_id", s.Addr)
}

// claimSlots gives the single node every slot and waits for the cluster to
// say ok.
func claimSlots(ctx context.Context, rdb *redis.Client) error {
	// A restarted node read its slots back from nodes.conf.
	if info, err := rdb.ClusterInfo(ctx).Result(); err == nil && strings.Contains(info, "cluster_state:ok") {
		return nil
	}
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

// RunReplica starts a standalone server with its files in dir that
// replicates the master at addr (host:port; a proxy in front of one will
// do), and returns once it is in sync. The caller must Stop it.
func RunReplica(dir, addr string) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	return start(bin, dir, false, []string{"--replicaof", host, port}, (*Server).waitSynced)
}

// waitSynced waits until the replica's link to its master is up.
func (s *Server) waitSynced() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer rdb.Close()
	for {
		info, err := rdb.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("replica on %s not in sync after 10s", s.Addr)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Restart kills the server and starts a new one on the same port and
// directory, as a crash and a supervisor's restart would: with persistence
// off it comes back empty, unless a SAVE wrote a snapshot into the
// directory, which it loads. The caller must Stop the new one.
func (s *Server) Restart() (*Server, error) {
	s.Stop()
	var last error
	// The port may linger a moment after the kill.
	for range 50 {
		n, err := launch(s.bin, s.dir, s.port, s.Cluster, s.extra)
		if err == nil {
			return n, nil
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return nil, last
}

// Signal sends sig to the server's process: SIGSTOP and SIGCONT freeze
// and resume it, as a hung host or a cut link would look to its peers.
func (s *Server) Signal(sig os.Signal) error { return s.cmd.Process.Signal(sig) }

// Stop kills the server and waits for it to exit. Clients see connection
// errors from then on. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
}
