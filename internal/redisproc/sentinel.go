package redisproc

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelDownAfter is how long the sentinels RunSentinels starts wait for
// a silent master before they call it down: short, so a failover takes
// seconds (production runs use 5-30 s).
const SentinelDownAfter = time.Second

// Sentinel is one running Redis Sentinel (redis-server --sentinel). Its
// methods are safe for concurrent use.
type Sentinel struct {
	// Addr is host:port on 127.0.0.1.
	Addr string
	srv  *Server
}

// RunSentinels starts n sentinels, each with its files in its own
// directory under dir, that watch the master at addr under name with a
// quorum of a majority, and returns once every one of them knows the
// master, its replicas replicas and the other sentinels, ready to fail
// over. The caller must Stop them.
func RunSentinels(dir, name, addr string, n, replicas int) ([]*Sentinel, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	var all []*Sentinel
	stop := func() {
		for _, s := range all {
			s.Stop()
		}
	}
	for i := range n {
		sdir := filepath.Join(dir, "sentinel-"+strconv.Itoa(i))
		if err := os.MkdirAll(sdir, 0o700); err != nil {
			stop()
			return nil, err
		}
		s, err := startSentinel(bin, sdir, name, addr, n/2+1)
		if err != nil {
			stop()
			return nil, err
		}
		all = append(all, s)
	}
	for _, s := range all {
		if err := s.waitWatching(name, n-1, replicas); err != nil {
			stop()
			return nil, err
		}
	}
	return all, nil
}

// startSentinel launches one sentinel on a free port, trying a few as
// start does.
func startSentinel(bin, dir, name, addr string, quorum int) (*Sentinel, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	var last error
	for range 5 {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		// Sentinel rewrites its configuration file (its id, what it
		// learns), so each gets a file of its own.
		conf := fmt.Sprintf("port %d\nbind 127.0.0.1\ndaemonize no\nlogfile \"sentinel.log\"\ndir %q\n"+
			"sentinel monitor %s %s %s %d\n"+
			"sentinel down-after-milliseconds %s %d\n"+
			"sentinel failover-timeout %s 10000\n"+
			"sentinel parallel-syncs %s 1\n",
			p, dir, name, host, port, quorum, name, SentinelDownAfter.Milliseconds(), name, name)
		path := filepath.Join(dir, "sentinel.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			return nil, err
		}
		s, err := launchSentinel(bin, dir, path, p)
		if err == nil {
			return s, nil
		}
		last = err
	}
	return nil, last
}

func launchSentinel(bin, dir, conf string, port int) (*Sentinel, error) {
	cmd := exec.Command(bin, conf, "--sentinel")
	cmd.Dir = dir
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s --sentinel: %w", bin, err)
	}
	srv := &Server{
		Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		bin:  bin, dir: dir, port: port, cmd: cmd, exited: make(chan struct{}),
	}
	go func() {
		_ = cmd.Wait()
		close(srv.exited)
	}()
	s := &Sentinel{Addr: srv.Addr, srv: srv}
	if err := s.waitReady(); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// waitReady waits until the sentinel answers on its port and is the
// process started.
func (s *Sentinel) waitReady() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer rdb.Close()
	for {
		select {
		case <-s.srv.exited:
			log, _ := os.ReadFile(filepath.Join(s.srv.dir, "sentinel.log"))
			return fmt.Errorf("sentinel on %s exited at start: %s", s.Addr, lastLines(string(log), 5))
		case <-ctx.Done():
			return fmt.Errorf("sentinel on %s not ready after 10s", s.Addr)
		case <-time.After(10 * time.Millisecond):
		}
		if err := rdb.Ping(ctx).Err(); err != nil {
			continue
		}
		return s.srv.ours(ctx, rdb)
	}
}

// waitWatching waits until the sentinel has found the master's replicas
// and the other sentinels, which it learns from the master over seconds.
func (s *Sentinel) waitWatching(name string, others, replicas int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := redis.NewSentinelClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer rdb.Close()
	var seen map[string]string
	for {
		m, err := rdb.Master(ctx, name).Result()
		if err == nil {
			seen = m
			if atLeast(m["num-other-sentinels"], others) && atLeast(m["num-slaves"], replicas) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sentinel on %s does not see %d sentinels and %d replicas after 30s: %v", s.Addr, others, replicas, seen)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func atLeast(v string, n int) bool {
	got, err := strconv.Atoi(v)
	return err == nil && got >= n
}

// Master asks the sentinel which address serves as the master of name.
func (s *Sentinel) Master(ctx context.Context, name string) (string, error) {
	rdb := redis.NewSentinelClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer rdb.Close()
	hp, err := rdb.GetMasterAddrByName(ctx, name).Result()
	if err != nil {
		return "", fmt.Errorf("sentinel on %s: master of %s: %w", s.Addr, name, err)
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// Stop kills the sentinel and waits for it to exit. Stopping a stopped
// sentinel does nothing.
func (s *Sentinel) Stop() { s.srv.Stop() }
