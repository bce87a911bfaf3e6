// Package redistest is the testing.TB face of internal/redisproc: a real
// redis-server per test, on a free loopback port, in the test's temporary
// directory, stopped when the test ends. There is no fallback to a fake:
// if redis-server is missing, the test fails and says how to install it.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/credpool/credpool/internal/redisproc"
)

// Server is one running redis-server with test helpers. Its methods are
// safe for concurrent use.
type Server struct{ *redisproc.Server }

// Start starts a standalone server and stops it when t ends.
func Start(t testing.TB) *Server { return start(t, false) }

// StartCluster starts a one-node cluster that owns every slot, so cluster
// rules (one slot per transaction, CROSSSLOT errors) apply.
func StartCluster(t testing.TB) *Server { return start(t, true) }

func start(t testing.TB, cluster bool) *Server {
	t.Helper()
	s, err := redisproc.Run(t.TempDir(), cluster)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(s.Stop)
	return &Server{s}
}

// Cluster is a Redis Cluster of several masters, each with its replicas.
// Its methods are safe for concurrent use.
type Cluster struct{ *redisproc.Cluster }

// StartClusterN starts a cluster of masters masters with replicas replicas
// each, formed and in sync when it returns (redisproc.RunCluster), and
// stops it when t ends.
func StartClusterN(t testing.TB, masters, replicas int) *Cluster {
	t.Helper()
	c, err := redisproc.RunCluster(t.TempDir(), masters, replicas)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(c.Stop)
	return &Cluster{c}
}

// Client returns a cluster client seeded with every node, closed when t
// ends.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// StartReplica starts a server that replicates the master at addr (a proxy
// in front of one will do), in sync when it returns, and stops it when t
// ends.
func StartReplica(t testing.TB, addr string) *Server {
	t.Helper()
	s, err := redisproc.RunReplica(t.TempDir(), addr)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(s.Stop)
	return &Server{s}
}

// Restart kills the server and starts it again on the same port, as a
// crash and a restart would: empty (no persistence), unless a SAVE wrote
// a snapshot into its directory, which it then loads, as Redis restarting
// from an RDB does. The new one stops when t ends. Clients of the old one
// reconnect to it.
func (s *Server) Restart(t testing.TB) *Server {
	t.Helper()
	n, err := s.Server.Restart()
	if err != nil {
		t.Fatalf("redistest: restart: %v", err)
	}
	t.Cleanup(n.Stop)
	return &Server{n}
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
