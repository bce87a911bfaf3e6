package optimistic

import (
	"cmp"
	"context"
	"errors"
	"fmt"
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
// does not see it. A cluster master that serves no slot (or cannot say
// which it serves) is only pinged; one that answers the probe with MOVED
// or ASK, its slot gone elsewhere meanwhile, is taken as up.
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
		tag, ok := s.probeTag(ctx, c, node)
		if !ok {
			return ping(ctx, node)
		}
		err := s.probe(ctx, node, s.keys.Probe(tag))
		if isRedirect(err) {
			// It answered, for a slot it gave up since it said so.
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

// probeTag returns a hash tag on a slot that the cluster serves from
// node, or false if it serves none there, or node could not say. It asks
// node itself which slots the cluster serves (a slot nobody serves is in
// no range; a silent node holds up only its own check) and takes the
// first whose master is node by the address the client dials it at.
func (s *Store) probeTag(ctx context.Context, c *redis.ClusterClient, node *redis.Client) (string, bool) {
	//lint:ignore SA1019 CLUSTER SLOTS is the map go-redis's cluster client reads itself, the view MasterForKey answers from
	ranges, err := node.ClusterSlots(ctx).Result()
	if err != nil {
		return "", false
	}
	tags := slotTags()
	for _, r := range ranges {
		tag := tags[r.Start]
		if m, err := c.MasterForKey(ctx, s.keys.Probe(tag)); err == nil && m.Options().Addr == node.Options().Addr {
			return tag, true
		}
	}
	return "", false
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
