package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/credpool/credpool/internal/redisproc"
)

// server is the Redis the Redis strategies share for a harness run.
type server struct {
	url   string
	where string // for the report
	admin *redis.Client
	stop  func()
}

// startRedis connects to rawURL, or with an empty one starts a throwaway
// redis-server on loopback that stop kills. A server off loopback is
// refused unless allowRemote: the harness loads it as hard as it can.
func startRedis(ctx context.Context, rawURL string, allowRemote bool) (*server, error) {
	s := &server{url: rawURL, stop: func() {}}
	if rawURL == "" {
		dir, err := os.MkdirTemp("", "credpool-bench-redis-")
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		srv, err := redisproc.Run(dir, false)
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("bench: start redis-server: %w", err)
		}
		s.url = "redis://" + srv.Addr
		s.where = "redis-server started by the harness on " + srv.Addr
		s.stop = func() {
			srv.Stop()
			_ = os.RemoveAll(dir)
		}
	}
	opt, err := redis.ParseURL(s.url)
	if err != nil {
		s.stop()
		return nil, fmt.Errorf("bench: --redis: %w", err)
	}
	if rawURL != "" {
		if !allowRemote && !loopback(opt) {
			s.stop()
			return nil, fmt.Errorf("bench: redis at %s is not on loopback; pass --allow-remote to load it anyway", opt.Addr)
		}
		s.where = opt.Addr
	}
	opt.PoolSize = 2
	s.admin = redis.NewClient(opt)
	stop := s.stop
	s.stop = func() {
		_ = s.admin.Close()
		stop()
	}
	if err := s.admin.Ping(ctx).Err(); err != nil {
		s.stop()
		return nil, fmt.Errorf("bench: redis at %s: %w", opt.Addr, err)
	}
	return s, nil
}

// loopback reports whether opt points at this machine.
func loopback(opt *redis.Options) bool {
	if opt.Network == "unix" {
		return true
	}
	host, _, err := net.SplitHostPort(opt.Addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// version is the server's redis_version.
func (s *server) version(ctx context.Context) (string, error) {
	info, err := s.admin.Info(ctx, "server").Result()
	if err != nil {
		return "", fmt.Errorf("bench: INFO server: %w", err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v, nil
		}
	}
	return "unknown", nil
}

// uncounted are the commands left out of commands per grant: connection
// set-up by new pooled connections, and the harness's own INFO.
var uncounted = map[string]bool{
	"info": true, "hello": true, "ping": true, "select": true, "auth": true,
	"client|setinfo": true, "client|setname": true, "command|docs": true,
}

// commandStats reads the calls per command from INFO commandstats.
func (s *server) commandStats(ctx context.Context) (map[string]int64, error) {
	info, err := s.admin.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("bench: INFO commandstats: %w", err)
	}
	return parseCommandStats(info), nil
}

// parseCommandStats reads lines like
// "cmdstat_get:calls=3,usec=10,usec_per_call=3.33,rejected_calls=0,failed_calls=0".
func parseCommandStats(info string) map[string]int64 {
	calls := map[string]int64{}
	for line := range strings.SplitSeq(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isStat := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isStat {
			continue
		}
		for field := range strings.SplitSeq(stats, ",") {
			if v, ok := strings.CutPrefix(field, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err == nil {
					calls[name] = n
				}
			}
		}
	}
	return calls
}

// commandDelta returns the counted commands run between two snapshots, by
// name, and their total.
func commandDelta(before, after map[string]int64) (map[string]int64, int64) {
	delta := map[string]int64{}
	var total int64
	for name, n := range after {
		if d := n - before[name]; d > 0 && !uncounted[name] {
			delta[name] = d
			total += d
		}
	}
	return delta, total
}

// dropPrefix deletes every key under prefix, so a run leaves nothing behind
// on a server it did not start.
func (s *server) dropPrefix(ctx context.Context, prefix string) error {
	iter := s.admin.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	var batch []string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := s.admin.Unlink(ctx, batch...).Err()
		batch = batch[:0]
		return err
	}
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			if err := flush(); err != nil {
				return fmt.Errorf("bench: clean up %s: %w", prefix, err)
			}
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("bench: clean up %s: %w", prefix, err)
	}
	if err := flush(); err != nil {
		return fmt.Errorf("bench: clean up %s: %w", prefix, err)
	}
	return nil
}
