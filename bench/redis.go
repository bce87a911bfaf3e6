package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/credpool/credpool/internal/redisproc"
)

// server is the Redis the Redis strategies share for a harness run.
type server struct {
	url string
	// cluster says url is a Redis Cluster's (redis://host:port?addr=...).
	cluster bool
	where   string // for the report
	// admin is a *redis.ClusterClient on a cluster, else a *redis.Client.
	admin redis.UniversalClient
	stop  func()
}

// startRedis connects to rawURL, a cluster's if cluster is set, or with an
// empty one starts a throwaway redis-server on loopback (a one-node
// cluster if cluster is set) that stop kills. A server off loopback is
// refused unless allowRemote: the harness loads it as hard as it can.
func startRedis(ctx context.Context, rawURL string, cluster, allowRemote bool) (*server, error) {
	s := &server{url: rawURL, cluster: cluster, stop: func() {}}
	if rawURL == "" {
		dir, err := os.MkdirTemp("", "credpool-bench-redis-")
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		srv, err := redisproc.Run(dir, cluster)
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("bench: start redis-server: %w", err)
		}
		s.url = "redis://" + srv.Addr
		s.where = "redis-server started by the harness on " + srv.Addr
		if cluster {
			s.where = "one-node Redis Cluster started by the harness on " + srv.Addr
		}
		s.stop = func() {
			srv.Stop()
			_ = os.RemoveAll(dir)
		}
	}
	seeds, err := s.connect()
	if err != nil {
		s.stop()
		return nil, err
	}
	if rawURL != "" {
		for _, seed := range seeds {
			if !allowRemote && !loopback(seed) {
				s.stop()
				return nil, fmt.Errorf("bench: redis at %s is not on loopback; pass --allow-remote to load it anyway", seed.Addr)
			}
		}
		s.where = seeds[0].Addr
		if cluster {
			s.where = "Redis Cluster at " + seeds[0].Addr
		}
	}
	stop := s.stop
	s.stop = func() {
		_ = s.admin.Close()
		stop()
	}
	if err := s.admin.Ping(ctx).Err(); err != nil {
		s.stop()
		return nil, fmt.Errorf("bench: redis at %s: %w", seeds[0].Addr, err)
	}
	if cluster && rawURL != "" && !allowRemote {
		// The seeds were on loopback; the masters they name must be too.
		err := s.forEachNode(ctx, func(_ context.Context, node *redis.Client) error {
			if !loopback(node.Options()) {
				return fmt.Errorf("bench: cluster node %s is not on loopback; pass --allow-remote to load it anyway", node.Options().Addr)
			}
			return nil
		})
		if err != nil {
			s.stop()
			return nil, err
		}
	}
	return s, nil
}

// connect opens the admin client of s.url and returns the servers the URL
// names: a cluster's seeds, or the one server.
func (s *server) connect() ([]*redis.Options, error) {
	if s.cluster {
		opt, err := redis.ParseClusterURL(s.url)
		if err != nil {
			return nil, fmt.Errorf("bench: --redis (a cluster URL with --redis-cluster): %w", err)
		}
		opt.PoolSize = 2
		s.admin = redis.NewClusterClient(opt)
		seeds := make([]*redis.Options, len(opt.Addrs))
		for i, a := range opt.Addrs {
			seeds[i] = &redis.Options{Addr: a}
		}
		return seeds, nil
	}
	opt, err := redis.ParseURL(s.url)
	if err != nil {
		return nil, fmt.Errorf("bench: --redis: %w", err)
	}
	opt.PoolSize = 2
	s.admin = redis.NewClient(opt)
	return []*redis.Options{opt}, nil
}

// forEachNode runs fn on every node that holds keys: each master of a
// cluster, or the one server.
func (s *server) forEachNode(ctx context.Context, fn func(ctx context.Context, node *redis.Client) error) error {
	if c, ok := s.admin.(*redis.ClusterClient); ok {
		return c.ForEachMaster(ctx, fn)
	}
	return fn(ctx, s.admin.(*redis.Client))
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
	// No host dials this machine; a cluster node names itself so when
	// it was never told its address.
	if host == "" || host == "localhost" {
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
// set-up by new pooled connections, a cluster client's reads of the slot
// map, and the harness's own INFO.
var uncounted = map[string]bool{
	"info": true, "hello": true, "ping": true, "select": true, "auth": true,
	"client|setinfo": true, "client|setname": true, "command|docs": true,
	"cluster|slots": true, "cluster|shards": true, "cluster|nodes": true, "readonly": true,
}

// subscribing are the pub/sub commands that go over a client's pub/sub
// connections, outside its pool: its round-trip count does not see them.
var subscribing = []string{"subscribe", "unsubscribe", "psubscribe", "punsubscribe", "ssubscribe", "sunsubscribe"}

// subscriptions is how many subscribing commands cmds (a commandDelta) holds.
func subscriptions(cmds map[string]int64) int64 {
	var n int64
	for _, name := range subscribing {
		n += cmds[name]
	}
	return n
}

// commandStats reads the calls per command from INFO commandstats, summed
// over a cluster's masters (replicas only repeat their masters' writes).
func (s *server) commandStats(ctx context.Context) (map[string]int64, error) {
	var mu sync.Mutex
	calls := map[string]int64{}
	err := s.forEachNode(ctx, func(ctx context.Context, node *redis.Client) error {
		info, err := node.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for name, n := range parseCommandStats(info) {
			calls[name] += n
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("bench: INFO commandstats: %w", err)
	}
	return calls, nil
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

// dropBatch bounds the UNLINKs of one pipeline in dropPrefix.
const dropBatch = 500

// dropPrefix deletes every key under prefix on every node, so a run leaves
// nothing behind on a server it did not start. One UNLINK per key, in
// pipelines: a cluster refuses a command whose keys span slots (CROSSSLOT).
func (s *server) dropPrefix(ctx context.Context, prefix string) error {
	err := s.forEachNode(ctx, func(ctx context.Context, node *redis.Client) error {
		iter := node.Scan(ctx, 0, prefix+":*", 1000).Iterator()
		var batch []string
		flush := func() error {
			if len(batch) == 0 {
				return nil
			}
			_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, key := range batch {
					p.Unlink(ctx, key)
				}
				return nil
			})
			batch = batch[:0]
			return err
		}
		for iter.Next(ctx) {
			batch = append(batch, iter.Val())
			if len(batch) == dropBatch {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if err := iter.Err(); err != nil {
			return err
		}
		return flush()
	})
	if err != nil {
		return fmt.Errorf("bench: clean up %s: %w", prefix, err)
	}
	return nil
}
