package redisproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// NodeTimeout is the cluster-node-timeout of a Cluster: a master that stops
// answering is flagged failed after it, and its replica takes over a few
// seconds later, instead of the 15 s default's half a minute.
const NodeTimeout = time.Second

// clusterArgs are the redis-server settings of every Cluster node.
// require-full-coverage off keeps the other masters serving while a failed
// master's slots have no owner; replica-validity-factor 0 lets a replica
// take over however long its link has been down; a diskless sync with no
// delay puts replicas in sync at once; and a master pinging its replicas
// every second moves their replication offset off zero, without which
// CLUSTER SLOTS does not list them (Redis 7).
var clusterArgs = []string{
	"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
	"--cluster-node-timeout", strconv.Itoa(int(NodeTimeout.Milliseconds())),
	"--cluster-require-full-coverage", "no",
	"--cluster-replica-validity-factor", "0",
	"--cluster-allow-replica-migration", "no",
	"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
	"--repl-ping-replica-period", "1",
}

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// Cluster is a Redis Cluster of real redis-server processes on loopback:
// masters that split the 16384 slots in contiguous ranges, each with its
// replicas. Roles change with failovers; the methods that name a master
// ask the live nodes. Its methods are safe for concurrent use.
type Cluster struct {
	// Nodes are every server: the masters first, in slot order, then the
	// replicas of Nodes[0], of Nodes[1], and so on.
	Nodes []*Server
	ids   map[*Server]string
	buses map[*Server]int // cluster bus ports
}

// RunCluster starts masters*(1+replicasPerMaster) servers in cluster mode,
// each with its files in a directory of its own under dir, joins them with
// CLUSTER MEET, gives each master its slot range (ADDSLOTSRANGE) and its
// replicas (CLUSTER REPLICATE), and returns once every node sees every
// slot served and every replica in sync. The caller must Stop it; the
// kernel kills the servers if the calling process dies first (Linux).
func RunCluster(dir string, masters, replicasPerMaster int) (*Cluster, error) {
	if masters < 1 || replicasPerMaster < 0 {
		return nil, fmt.Errorf("redisproc: a cluster needs at least one master and no negative replica count, not %d and %d", masters, replicasPerMaster)
	}
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	c := &Cluster{ids: make(map[*Server]string), buses: make(map[*Server]int)}
	total := masters * (1 + replicasPerMaster)
	for i := range total {
		node := filepath.Join(dir, fmt.Sprintf("node-%d", i))
		if err := os.MkdirAll(node, 0o700); err != nil {
			c.Stop()
			return nil, err
		}
		s, bus, err := startNode(bin, node)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Nodes = append(c.Nodes, s)
		c.buses[s] = bus
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.form(ctx, masters, replicasPerMaster); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// startNode launches one cluster node on a free port with a free cluster
// bus port (the default, port+10000, may lie beyond 65535).
func startNode(bin, dir string) (*Server, int, error) {
	var last error
	for range 5 {
		bus, err := freePort()
		if err != nil {
			return nil, 0, err
		}
		extra := append([]string{"--cluster-port", strconv.Itoa(bus)}, clusterArgs...)
		s, err := start(bin, dir, false, extra, nil)
		if err == nil {
			return s, bus, nil
		}
		last = err
	}
	return nil, 0, last
}

// form joins the started nodes into a cluster.
func (c *Cluster) form(ctx context.Context, masters, replicasPerMaster int) error {
	for i, s := range c.Nodes {
		err := s.with(func(rdb *redis.Client) error {
			// Distinct epochs before the nodes meet, as redis-cli does, so
			// that failover elections need no collision resolution first.
			if err := rdb.Do(ctx, "cluster", "set-config-epoch", i+1).Err(); err != nil {
				return fmt.Errorf("cluster set-config-epoch on %s: %w", s.Addr, err)
			}
			id, err := rdb.Do(ctx, "cluster", "myid").Text()
			c.ids[s] = id
			return err
		})
		if err != nil {
			return err
		}
	}
	for _, s := range c.Nodes[1:] {
		host, port, _ := net.SplitHostPort(s.Addr)
		if err := c.Nodes[0].with(func(rdb *redis.Client) error {
			return rdb.Do(ctx, "cluster", "meet", host, port, c.buses[s]).Err()
		}); err != nil {
			return fmt.Errorf("cluster meet %s: %w", s.Addr, err)
		}
	}
	if err := c.waitAll(ctx, "every node knows every other", func(rdb *redis.Client) (string, bool, error) {
		nodes, err := rdb.ClusterNodes(ctx).Result()
		return "", strings.Count(nodes, "\n") >= len(c.Nodes) && !strings.Contains(nodes, "handshake"), err
	}); err != nil {
		return err
	}
	for i, s := range c.Nodes[:masters] {
		first, last := i*clusterSlots/masters, (i+1)*clusterSlots/masters-1
		if err := s.with(func(rdb *redis.Client) error {
			return rdb.Do(ctx, "cluster", "addslotsrange", first, last).Err()
		}); err != nil {
			return fmt.Errorf("cluster addslotsrange on %s: %w", s.Addr, err)
		}
	}
	for i, s := range c.Nodes[masters:] {
		master := c.Nodes[i/replicasPerMaster]
		if err := s.with(func(rdb *redis.Client) error {
			return rdb.ClusterReplicate(ctx, c.ids[master]).Err()
		}); err != nil {
			return fmt.Errorf("cluster replicate %s on %s: %w", master.Addr, s.Addr, err)
		}
	}
	for _, s := range c.Nodes[masters:] {
		if err := s.waitSynced(); err != nil {
			return err
		}
	}
	return c.WaitHealthy(ctx)
}

// WaitHealthy waits until every live node says cluster_state:ok and maps
// every slot to a live master, lists every live node, and they all agree.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	return c.waitAll(ctx, "the cluster is healthy and every node agrees", func(rdb *redis.Client) (string, bool, error) {
		info, err := rdb.ClusterInfo(ctx).Result()
		if err != nil || !strings.Contains(info, "cluster_state:ok") {
			return "", false, err
		}
		//lint:ignore SA1019 CLUSTER SLOTS is the map go-redis's cluster client reads; the harness waits for the view clients get
		slots, err := rdb.ClusterSlots(ctx).Result()
		if err != nil {
			return "", false, err
		}
		view, ok := c.describe(slots)
		return view, ok, nil
	})
}

// describe renders a node's slot map, and says whether it covers every
// slot with live masters and lists every live node.
func (c *Cluster) describe(slots []redis.ClusterSlot) (string, bool) {
	var b strings.Builder
	covered, listed := 0, map[string]bool{}
	ok := true
	for _, s := range slots {
		covered += s.End - s.Start + 1
		fmt.Fprintf(&b, "%d-%d", s.Start, s.End)
		var replicas []string
		for i, n := range s.Nodes {
			listed[n.Addr] = true
			if i == 0 {
				b.WriteString(" " + n.Addr)
				if node := c.byAddr(n.Addr); node == nil || !node.alive() {
					ok = false
				}
				continue
			}
			replicas = append(replicas, n.Addr)
		}
		// Nodes list a master's replicas in an order of their own.
		slices.Sort(replicas)
		for _, r := range replicas {
			b.WriteString(" " + r)
		}
		b.WriteString(";")
	}
	for _, s := range c.Nodes {
		if s.alive() && !listed[s.Addr] {
			ok = false
		}
	}
	return b.String(), ok && covered == clusterSlots
}

// waitAll polls check on every live node until, in one round, all say ok
// and give the same view.
func (c *Cluster) waitAll(ctx context.Context, what string, check func(*redis.Client) (view string, ok bool, err error)) error {
	var last error
	for {
		all, views := true, map[string]bool{}
		for _, s := range c.Nodes {
			if !s.alive() {
				continue
			}
			var (
				view string
				ok   bool
			)
			if err := s.with(func(rdb *redis.Client) (err error) {
				view, ok, err = check(rdb)
				return err
			}); err != nil {
				last = err
			}
			all = all && ok
			views[view] = true
		}
		if all && len(views) <= 1 {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("redisproc: waiting until %s: %w", what, ctx.Err()), last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Addrs are every node's address, the seeds of a cluster client.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		addrs[i] = s.Addr
	}
	return addrs
}

// ID is the node's cluster id (CLUSTER MYID).
func (c *Cluster) ID(s *Server) string { return c.ids[s] }

// Kill kills the node with SIGKILL (kill -9) and waits for it to exit, as
// a crash would: it answers nothing from then on.
func (c *Cluster) Kill(s *Server) { s.Stop() }

// Stop kills every node.
func (c *Cluster) Stop() {
	for _, s := range c.Nodes {
		s.Stop()
	}
}

// Slot is the hash slot of key (CLUSTER KEYSLOT, asked of a live node).
func (c *Cluster) Slot(ctx context.Context, key string) (int, error) {
	var slot int64
	err := c.any(func(rdb *redis.Client) (err error) {
		slot, err = rdb.ClusterKeySlot(ctx, key).Result()
		return err
	})
	return int(slot), err
}

// MasterOf returns the master of key's slot and its replicas, by the slot
// map of a live node.
func (c *Cluster) MasterOf(ctx context.Context, key string) (master *Server, replicas []*Server, err error) {
	slot, err := c.Slot(ctx, key)
	if err != nil {
		return nil, nil, err
	}
	var slots []redis.ClusterSlot
	if err := c.any(func(rdb *redis.Client) (err error) {
		//lint:ignore SA1019 CLUSTER SLOTS is the map go-redis's cluster client reads; the harness waits for the view clients get
		slots, err = rdb.ClusterSlots(ctx).Result()
		return err
	}); err != nil {
		return nil, nil, err
	}
	for _, s := range slots {
		if slot < s.Start || slot > s.End {
			continue
		}
		for i, n := range s.Nodes {
			node := c.byAddr(n.Addr)
			if node == nil {
				return nil, nil, fmt.Errorf("redisproc: slot %d is served by %s, no node of this cluster", slot, n.Addr)
			}
			if i == 0 {
				master = node
			} else {
				replicas = append(replicas, node)
			}
		}
		return master, replicas, nil
	}
	return nil, nil, fmt.Errorf("redisproc: slot %d has no master", slot)
}

// WaitPromoted waits until a live node other than old says it is a master
// and serves key's slot, as after a failover away from old, and returns it.
func (c *Cluster) WaitPromoted(ctx context.Context, key string, old *Server) (*Server, error) {
	slot, err := c.Slot(ctx, key)
	if err != nil {
		return nil, err
	}
	for {
		for _, s := range c.Nodes {
			if s == old || !s.alive() {
				continue
			}
			var owns bool
			_ = s.with(func(rdb *redis.Client) error {
				owns = ownsSlot(ctx, rdb, s.Addr, slot)
				return nil
			})
			if owns {
				return s, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("redisproc: no node took over slot %d from %s: %w", slot, old.Addr, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// ownsSlot says whether the node at addr, through rdb, is a master and maps
// slot to itself.
func ownsSlot(ctx context.Context, rdb *redis.Client, addr string, slot int) bool {
	role, err := rdb.Do(ctx, "role").Slice()
	if err != nil || len(role) == 0 || role[0] != "master" {
		return false
	}
	//lint:ignore SA1019 CLUSTER SLOTS is the map go-redis's cluster client reads; the harness waits for the view clients get
	slots, err := rdb.ClusterSlots(ctx).Result()
	if err != nil {
		return false
	}
	for _, s := range slots {
		if slot >= s.Start && slot <= s.End && len(s.Nodes) > 0 {
			return s.Nodes[0].Addr == addr
		}
	}
	return false
}

// any runs fn on the first live node that answers it without error.
func (c *Cluster) any(fn func(*redis.Client) error) error {
	last := errors.New("redisproc: no live node in the cluster")
	for _, s := range c.Nodes {
		if !s.alive() {
			continue
		}
		if last = s.with(fn); last == nil {
			return nil
		}
	}
	return last
}

func (c *Cluster) byAddr(addr string) *Server {
	for _, s := range c.Nodes {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// with runs fn on a short-lived client of s alone, which follows no
// redirection and does not retry.
func (s *Server) with(fn func(*redis.Client) error) error {
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialerRetries: 1})
	defer rdb.Close()
	return fn(rdb)
}

// alive says whether the process still runs.
func (s *Server) alive() bool {
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}
