package optimistic

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// probeTTL is how long a probe write stays: long enough for the next
// check to overwrite it, short enough to leave nothing behind for long.
const probeTTL = time.Minute

// Ping checks that Redis answers: on a cluster, at least one master (the
// keys on the others still grant; Nodes says which are down); on other
// clients (a Ring, say) what their own Ping reaches.
func (s *Store) Ping(ctx context.Context) error {
	c, ok := s.rdb.(*redis.ClusterClient)
	if !ok {
		return Classify(ctx, "ping", s.rdb.Ping(ctx).Err())
	}
	var first error
	for _, n := range s.nodes(ctx, c, ping) {
		if n.Err == nil {
			return nil
		}
		first = cmp.Or(first, n.Err)
	}
	if first == nil {
		first = errors.New("the cluster names no master")
	}
	return Classify(ctx, "ping", first)
}

// NodeHealth is one Redis server of a Store and whether it can grant.
type NodeHealth struct {
	// Addr is the server's host:port as the client dials it.
	Addr string
	// Err is why the server cannot take a grant now: it did not answer,
	// it refused the probe's write (a read-only replica, maxmemory
	// reached, too few replicas for its min-replicas-to-write, a failed
	// save), or fewer than Options.MinReplicas replicas acknowledged the
	// write in time. Nil if it took the write.
	Err error
}

// Nodes checks each master of a cluster, in address order, at once; a
// store on another client has one node, what its commands reach (Addr
// empty for a Ring or a Sentinel-managed client, whose master moves).
//
// A check writes, as a grant does: it sets the probe key
// (<prefix>:probe:{<tag>}, on a slot the master serves, for a minute)
// and, with Options.MinReplicas, waits for as many replicas to have it.
// A server that answers reads but refuses writes cannot grant, and Ping
// does not see it. A cluster master that serves no slot (or when the
// cluster cannot say which it serves) is only pinged; one that answers a
// probe with MOVED or ASK, its slot gone elsewhere since the client read
// the map, is taken as up, and the next check asks the cluster again.
func (s *Store) Nodes(ctx context.Context) []NodeHealth {
	c, ok := s.rdb.(*redis.ClusterClient)
	if !ok {
		addr := ""
		// A Sentinel-managed client names itself "FailoverClient" there.
		if o, ok := s.rdb.(*redis.Client); ok && o.Options().Addr != "FailoverClient" {
			addr = o.Options().Addr
		}
		return []NodeHealth{{Addr: addr, Err: s.probe(ctx, s.rdb, s.keys.Probe("0"))}}
	}
	return s.nodes(ctx, c, func(ctx context.Context, node *redis.Client) error {
		addr := node.Options().Addr
		key, ok := s.probes.key(ctx, c, node, s.keys.Probe)
		if !ok {
			return ping(ctx, node)
		}
		err := s.probe(ctx, node, key)
		if rerouted(err) {
			// The slot moved, or nobody serves it now: the next check
			// asks the cluster again where to write.
			s.probes.forget(addr)
		}
		if isRedirect(err) {
			// It answered, for a slot it no longer serves.
			return nil
		}
		return err
	})
}

// ping checks that node answers.
func ping(ctx context.Context, node *redis.Client) error { return node.Ping(ctx).Err() }

// nodes runs check on each master of c at once and returns their health
// in address order.
func (s *Store) nodes(ctx context.Context, c *redis.ClusterClient, check func(context.Context, *redis.Client) error) []NodeHealth {
	var (
		mu  sync.Mutex
		out []NodeHealth
	)
	err := c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		err := check(ctx, node)
		mu.Lock()
		out = append(out, NodeHealth{Addr: node.Options().Addr, Err: err})
		mu.Unlock()
		return nil
	})
	if err != nil {
		// The slot map could not be read at all.
		return []NodeHealth{{Err: err}}
	}
	slices.SortFunc(out, func(a, b NodeHealth) int { return strings.Compare(a.Addr, b.Addr) })
	return out
}

// probe writes key on c, in one round trip, as a grant writes on its
// server: SET, and WAIT when the store asks replicas to acknowledge its
// writes (only a plain client can send it on the same connection, as
// write says).
func (s *Store) probe(ctx context.Context, c redis.UniversalClient, key string) error {
	var (
		set  *redis.StatusCmd
		wait *redis.Cmd
	)
	_, plain := c.(*redis.Client)
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		set = p.Set(ctx, key, s.id, probeTTL)
		if s.opts.MinReplicas > 0 && plain {
			wait = p.Do(ctx, s.waitArgs()...)
		}
		return nil
	})
	switch err := set.Err(); {
	case refusesWrites(err):
		return fmt.Errorf("refuses writes: %w", err)
	case err != nil:
		return err
	case s.opts.MinReplicas == 0:
		return nil
	case wait == nil:
		return fmt.Errorf("%w: no WAIT through %T", errUnreplicated, c)
	}
	return s.acked(wait)
}

// probeSlots remembers a slot of each cluster master, by address, for
// its probe key, so that a check costs no round trip but the probe's
// while the slot map stays. It is safe for concurrent use; it holds its
// lock over no round trip.
type probeSlots struct {
	mu    sync.Mutex
	slots map[string]int
}

// key returns a probe key (named by name from a hash tag) on a slot that
// the cluster serves from node, or false if it serves none there, or node
// could not say.
func (p *probeSlots) key(ctx context.Context, c *redis.ClusterClient, node *redis.Client, name func(tag string) string) (string, bool) {
	addr := node.Options().Addr
	tags := slotTags()
	p.mu.Lock()
	slot, ok := p.slots[addr]
	p.mu.Unlock()
	if ok {
		if n, err := c.MasterForKey(ctx, name(tags[slot])); err == nil && n.Options().Addr == addr {
			return name(tags[slot]), true
		}
	}
	// New, or the map changed: ask node itself (a silent one holds up
	// only its own check) which slots the cluster serves (a slot nobody
	// serves is in no range), and note the first of each master's, by the
	// address the client dials it at.
	//lint:ignore SA1019 CLUSTER SLOTS is the map go-redis's cluster client reads itself, the view MasterForKey answers from
	ranges, err := node.ClusterSlots(ctx).Result()
	if err != nil {
		return "", false
	}
	first := map[string]int{}
	for _, r := range ranges {
		n, err := c.MasterForKey(ctx, name(tags[r.Start]))
		if err != nil {
			continue
		}
		if _, ok := first[n.Options().Addr]; !ok {
			first[n.Options().Addr] = r.Start
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.slots == nil {
		p.slots = map[string]int{}
	}
	maps.Copy(p.slots, first)
	slot, ok = first[addr]
	if !ok {
		delete(p.slots, addr)
	}
	return name(tags[slot]), ok
}

// forget drops the slot noted for addr.
func (p *probeSlots) forget(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.slots, addr)
}

// clusterSlots is the number of Redis Cluster hash slots.
const clusterSlots = 16384

// slotTags holds a hash tag for each Redis Cluster slot: the first of
// "0", "1", "2", … that hashes to it.
var slotTags = sync.OnceValue(func() []string {
	tags := make([]string, clusterSlots)
	for i, left := 0, clusterSlots; left > 0; i++ {
		tag := strconv.Itoa(i)
		if slot := tagSlot(tag); tags[slot] == "" {
			tags[slot] = tag
			left--
		}
	}
	return tags
})

// tagSlot is the Redis Cluster slot of a key whose hash tag is tag:
// CRC16 (XMODEM) of the tag, modulo the number of slots.
func tagSlot(tag string) int {
	var crc uint16
	for i := range len(tag) {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % clusterSlots
}
