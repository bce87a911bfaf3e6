package test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/redisproc"
	"github.com/credpool/credpool/internal/redisschema"
	"github.com/credpool/credpool/internal/server"
	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/test/redistest"
)

// The tests below run the WATCH/MULTI store on a real multi-node Redis
// Cluster while its topology changes under load: a graceful failover, a
// slot migration, a master killed with SIGKILL. Callers allocate one key
// each, hold it a moment and release it; by their own clocks (holding from
// the grant's return to the release call) no key may ever have more
// holders than its limit, and no fencing token may repeat.

var clusterKeys = redisschema.Schema{Prefix: redisschema.DefaultPrefix}

// serveClient is a client of c bounded as credpool serve bounds its own
// (internal/server: 1s timeouts, one retry, one dial, a 1s pool wait),
// its slot map kept fresh as serve keeps it (server.KeepTopology).
func serveClient(t *testing.T, c *redistest.Cluster) *redis.ClusterClient {
	t.Helper()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: c.Addrs(), ContextTimeoutEnabled: true,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second, PoolTimeout: time.Second,
		MaxRetries: 1, DialerRetries: 1,
	})
	stop := server.KeepTopology(rdb, server.DefaultClusterRefresh)
	t.Cleanup(func() {
		stop()
		_ = rdb.Close()
	})
	return rdb
}

// keyOn returns an unused key id whose slot master serves.
func keyOn(t *testing.T, c *redistest.Cluster, master *redisproc.Server, taken map[string]bool) string {
	t.Helper()
	for i := range 1000 {
		id := fmt.Sprintf("key-%d", i)
		if taken[id] {
			continue
		}
		m, _, err := c.MasterOf(context.Background(), clusterKeys.Key(id))
		require.NoError(t, err)
		if m == master {
			taken[id] = true
			return id
		}
	}
	t.Fatalf("no key id found on %s", master.Addr)
	return ""
}

// callFailure is one failed call of a caller.
type callFailure struct {
	key, op string
	at      time.Time
	err     error
}

// audit is what the callers saw, by their own clocks. It is safe for
// concurrent use.
type audit struct {
	mu       sync.Mutex
	limits   map[string]int
	holders  map[string]int
	over     []string // "key: n holders" each time a key had more than its limit
	fences   map[string]map[int64]bool
	reused   []string
	grants   map[string][]time.Time
	failures []callFailure
}

func newAudit(limits map[string]int) *audit {
	a := &audit{limits: limits, holders: map[string]int{}, fences: map[string]map[int64]bool{}, grants: map[string][]time.Time{}}
	for k := range limits {
		a.fences[k] = map[int64]bool{}
	}
	return a
}

func (a *audit) hold(l optimistic.Lease) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := l.KeyID
	a.grants[k] = append(a.grants[k], time.Now())
	if a.holders[k]++; a.holders[k] > a.limits[k] {
		a.over = append(a.over, fmt.Sprintf("%s: %d holders, limit %d", k, a.holders[k], a.limits[k]))
	}
	if a.fences[k][l.Fence] {
		a.reused = append(a.reused, fmt.Sprintf("%s: fence %d", k, l.Fence))
	}
	a.fences[k][l.Fence] = true
}

func (a *audit) drop(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.holders[key]--
}

func (a *audit) fail(key, op string, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.failures = append(a.failures, callFailure{key: key, op: op, at: time.Now(), err: err})
}

// firstGrantAfter is the first grant of key at or after t, or zero.
func (a *audit) firstGrantAfter(key string, t time.Time) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, g := range a.grants[key] {
		if !g.Before(t) {
			return g
		}
	}
	return time.Time{}
}

// failuresOf returns the failures of the keys for which keep is true.
func (a *audit) failuresOf(keep func(callFailure) bool) []callFailure {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []callFailure
	for _, f := range a.failures {
		if keep(f) {
			out = append(out, f)
		}
	}
	return out
}

// check asserts the invariants: never more holders than a key's limit,
// never a fencing token twice.
func (a *audit) check(t *testing.T) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	require.Empty(t, a.over, "a key had more holders than its limit")
	require.Empty(t, a.reused, "a fencing token was handed out twice")
}

// callers runs per callers on each key of the audit until ctx ends:
// allocate, hold for hold, release. A failed call is recorded and followed
// by a short pause. It returns once every caller has stopped.
func callers(ctx context.Context, store *optimistic.Store, a *audit, per int, hold time.Duration) {
	var wg sync.WaitGroup
	for key := range a.limits {
		for range per {
			wg.Go(func() {
				for ctx.Err() == nil {
					lease, _, err := store.Allocate(ctx, optimistic.AllocateRequest{
						Provider: "p", Pool: "default", Candidates: []string{key}, TTL: time.Minute,
					})
					switch {
					case ctx.Err() != nil:
						if err == nil {
							releaseQuietly(store, lease.LeaseRef)
						}
						return
					case err == nil:
						a.hold(lease)
						time.Sleep(hold)
						a.drop(key)
						release(ctx, store, a, lease.LeaseRef)
					case errors.Is(err, optimistic.ErrNoCapacity):
						time.Sleep(time.Millisecond)
					default:
						a.fail(key, "allocate", err)
						time.Sleep(5 * time.Millisecond)
					}
				}
			})
		}
	}
	wg.Wait()
}

// release gives the lease back and, as the service's release backlog
// does, tries again after a failure (recorded) until the store answers or
// ctx ends: a lease whose master died is still held on the promoted
// replica, and would keep its slot until it expires.
func release(ctx context.Context, store *optimistic.Store, a *audit, ref optimistic.LeaseRef) {
	for {
		err := store.Release(context.WithoutCancel(ctx), ref)
		if err == nil || errors.Is(err, optimistic.ErrLeaseLost) {
			return
		}
		a.fail(ref.KeyID, "release", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func releaseQuietly(store *optimistic.Store, ref optimistic.LeaseRef) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = store.Release(ctx, ref)
}

// syncKeys puts each key, with its limit, into the store.
func syncKeys(t *testing.T, store *optimistic.Store, limits map[string]int) {
	t.Helper()
	for id, limit := range limits {
		require.NoError(t, store.SyncKey(context.Background(), optimistic.KeyState{
			ID: id, Provider: "p", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: limit,
		}))
	}
}

// requireNothingHeld asserts that no key holds a lease once every caller
// released what it held.
func requireNothingHeld(t *testing.T, store *optimistic.Store, limits map[string]int) {
	t.Helper()
	for id := range limits {
		info, err := store.Inspect(context.Background(), id)
		require.NoError(t, err)
		require.Zero(t, info[0].Live, "%s still holds leases: a grant happened twice or a release was lost", id)
	}
}

func describe(fs []callFailure) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = fmt.Sprintf("%s %s %s: %v", f.at.Format("15:04:05.000"), f.op, f.key, f.err)
	}
	return out
}

// A graceful CLUSTER FAILOVER of the master that owns a hot key, and one
// back, under 24 callers: the slot moves between a WATCH and its EXEC
// (MOVED, an EXECABORT of the MULTI), which the store retries as a
// conflict. No call fails on the store; a call may run out of conflict
// retries (ErrContended, a 429 the caller backs off from), no more.
func TestClusterGracefulFailoverUnderLoad(t *testing.T) {
	c := redistest.StartClusterN(t, 3, 1)
	store, err := optimistic.New(serveClient(t, c), nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	master, _, err := c.MasterOf(ctx, clusterKeys.Key("hot"))
	require.NoError(t, err)
	taken := map[string]bool{"hot": true}
	limits := map[string]int{"hot": 3, keyOn(t, c, master, taken): 2}
	for _, m := range c.Nodes[:3] {
		if m != master {
			limits[keyOn(t, c, m, taken)] = 2
		}
	}
	syncKeys(t, store, limits)
	a := newAudit(limits)
	load, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		callers(load, store, a, 6, time.Millisecond)
	}()

	var failovers []time.Time
	for range 2 {
		time.Sleep(500 * time.Millisecond)
		// After the first failover the old master rejoins as a replica,
		// which the cluster may not show yet on a loaded machine.
		require.NoError(t, c.WaitHealthy(ctx), "every node is in the slot map, the old master as a replica")
		old, replicas, err := c.MasterOf(ctx, clusterKeys.Key("hot"))
		require.NoError(t, err)
		require.NotEmpty(t, replicas)
		require.NoError(t, clusterDo(ctx, replicas[0], "cluster", "failover"))
		promoted, err := c.WaitPromoted(ctx, clusterKeys.Key("hot"), old)
		require.NoError(t, err)
		require.Equal(t, replicas[0], promoted)
		failovers = append(failovers, time.Now())
	}
	time.Sleep(time.Second)
	stop()
	<-done

	a.check(t)
	for _, at := range failovers {
		require.False(t, a.firstGrantAfter("hot", at).IsZero(), "the hot key grants after the failover")
	}
	bad := a.failuresOf(func(f callFailure) bool { return !errors.Is(f.err, optimistic.ErrContended) })
	require.Empty(t, describe(bad), "calls failed other than by running out of conflict retries")
	t.Logf("calls that ran out of conflict retries: %d", len(a.failuresOf(func(callFailure) bool { return true })))
	requireNothingHeld(t, store, limits)
}

// clusterDo sends one command to the node s alone.
func clusterDo(ctx context.Context, s *redisproc.Server, args ...any) error {
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer rdb.Close()
	return rdb.Do(ctx, args...).Err()
}

// A hot key's slot migrates to another master under 24 callers, its keys
// a few at a time (CLUSTER SETSLOT MIGRATING/IMPORTING, MIGRATE, SETSLOT
// NODE): while the slot is migrating, the source answers ASK for a new
// lease record and TRYAGAIN for a credential split between the nodes, in
// MULTI and in the reads. The store never transacts across the two nodes:
// it retries as a conflict until the slot has moved. No call fails on the
// store; a call may run out of conflict retries (ErrContended).
func TestClusterSlotMigrationUnderLoad(t *testing.T) {
	c := redistest.StartClusterN(t, 3, 0)
	store, err := optimistic.New(serveClient(t, c), nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	source, _, err := c.MasterOf(ctx, clusterKeys.Key("hot"))
	require.NoError(t, err)
	target := c.Nodes[0]
	if target == source {
		target = c.Nodes[1]
	}
	slot, err := c.Slot(ctx, clusterKeys.Key("hot"))
	require.NoError(t, err)
	limits := map[string]int{"hot": 4}
	syncKeys(t, store, limits)
	a := newAudit(limits)
	load, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		callers(load, store, a, 8, time.Millisecond)
	}()

	time.Sleep(500 * time.Millisecond)
	require.NoError(t, clusterDo(ctx, target, "cluster", "setslot", slot, "importing", c.ID(source)))
	require.NoError(t, clusterDo(ctx, source, "cluster", "setslot", slot, "migrating", c.ID(target)))
	time.Sleep(300 * time.Millisecond)
	moved, err := migrateSlot(ctx, source, target, slot)
	require.NoError(t, err)
	for _, n := range []*redisproc.Server{target, source} {
		require.NoError(t, clusterDo(ctx, n, "cluster", "setslot", slot, "node", c.ID(target)))
	}
	finished := time.Now()
	time.Sleep(time.Second)
	stop()
	<-done

	require.Positive(t, moved, "the slot held the hot key's data")
	m, _, err := c.MasterOf(ctx, clusterKeys.Key("hot"))
	require.NoError(t, err)
	require.Equal(t, target, m)
	a.check(t)
	require.False(t, a.firstGrantAfter("hot", finished).IsZero(), "the hot key grants on its new master")
	bad := a.failuresOf(func(f callFailure) bool { return !errors.Is(f.err, optimistic.ErrContended) })
	require.Empty(t, describe(bad), "calls failed other than by running out of conflict retries")
	t.Logf("calls that ran out of conflict retries while the slot moved: %d", len(a.failuresOf(func(callFailure) bool { return true })))
	requireNothingHeld(t, store, limits)
}

// migrateSlot moves the slot's keys from source to target two at a time,
// pausing between batches so that callers meet a credential split
// between the nodes, and returns how many it moved.
func migrateSlot(ctx context.Context, source, target *redisproc.Server, slot int) (int, error) {
	rdb := redis.NewClient(&redis.Options{Addr: source.Addr, MaxRetries: -1})
	defer rdb.Close()
	host, port, err := net.SplitHostPort(target.Addr)
	if err != nil {
		return 0, err
	}
	moved := 0
	for {
		keys, err := rdb.ClusterGetKeysInSlot(ctx, slot, 2).Result()
		if err != nil || len(keys) == 0 {
			return moved, err
		}
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := rdb.Do(ctx, args...).Err(); err != nil {
			return moved, err
		}
		moved += len(keys)
		time.Sleep(30 * time.Millisecond)
	}
}

// finishMigration moves the slot's keys (migrateSlot) and gives the slot
// to target.
func finishMigration(ctx context.Context, c *redistest.Cluster, source, target *redisproc.Server, slot int) error {
	if _, err := migrateSlot(ctx, source, target, slot); err != nil {
		return err
	}
	for _, n := range []*redisproc.Server{target, source} {
		if err := clusterDo(ctx, n, "cluster", "setslot", slot, "node", c.ID(target)); err != nil {
			return err
		}
	}
	return nil
}

// A master killed with SIGKILL under load (2 callers per key, 2 keys per
// master): the keys of the other masters grant throughout, every call on
// them succeeds; the dead master's keys fail (ErrStore) until its replica
// is promoted and grant again soon after, once the client's slot map
// (kept fresh by server.KeepTopology) names the new master, or once the
// hold ends if the replica had missed grants. The bound asserted is a
// generous 30s; the measured times are logged.
func TestClusterMasterKilledUnderLoad(t *testing.T) {
	c := redistest.StartClusterN(t, 3, 1)
	// The replica may miss the last grants on a loaded machine: the store
	// then holds the key back (LostHold), which the default (an hour)
	// would stretch past any bound here. The callers hold for a
	// millisecond and release until the store answers, so a short hold
	// covers every lease that may have been lost.
	store, err := optimistic.New(serveClient(t, c), &optimistic.Options{LostHold: 5 * time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	victim := c.Nodes[0]
	taken := map[string]bool{}
	limits := map[string]int{}
	onVictim := map[string]bool{}
	for _, m := range c.Nodes[:3] {
		for range 2 {
			id := keyOn(t, c, m, taken)
			limits[id] = 2
			onVictim[id] = m == victim
		}
	}
	syncKeys(t, store, limits)
	a := newAudit(limits)
	load, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		callers(load, store, a, 2, time.Millisecond)
	}()

	time.Sleep(time.Second)
	var victimKey string
	for id := range onVictim {
		if onVictim[id] {
			victimKey = id
		}
	}
	c.Kill(victim)
	killed := time.Now()
	wait, cancelWait := context.WithTimeout(ctx, 30*time.Second)
	defer cancelWait()
	_, err = c.WaitPromoted(wait, clusterKeys.Key(victimKey), victim)
	require.NoError(t, err, "a replica takes over within 30s")
	promoted := time.Now()
	waitFor(t, "granting the dead master's keys again", 30*time.Second, func() bool {
		for id := range onVictim {
			if onVictim[id] && a.firstGrantAfter(id, promoted).IsZero() {
				return false
			}
		}
		return true
	})
	time.Sleep(500 * time.Millisecond)
	stop()
	<-done

	a.check(t)
	others := a.failuresOf(func(f callFailure) bool { return !onVictim[f.key] })
	require.Empty(t, describe(others), "calls on the keys of live masters failed")
	var recovered time.Duration
	for id := range onVictim {
		if onVictim[id] {
			recovered = max(recovered, a.firstGrantAfter(id, promoted).Sub(promoted))
		}
	}
	lastFailure := time.Time{}
	for _, f := range a.failuresOf(func(f callFailure) bool { return onVictim[f.key] }) {
		require.ErrorIs(t, f.err, optimistic.ErrStore, "%s", describe([]callFailure{f}))
		if f.at.After(lastFailure) {
			lastFailure = f.at
		}
	}
	t.Logf("replica promoted %v after the kill; the dead master's keys granted again %v after the promotion (last failed call %v after it)",
		promoted.Sub(killed).Round(time.Millisecond), recovered.Round(time.Millisecond), lastFailure.Sub(promoted).Round(time.Millisecond))
}

// beforeMulti is a hook for a cluster's node clients that runs move once,
// the first time a transaction's MULTI is about to go out: between the
// store's WATCH and reads and its EXEC.
type beforeMulti struct {
	once *sync.Once
	move func()
}

func (h beforeMulti) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h beforeMulti) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h beforeMulti) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "multi" {
			h.once.Do(h.move)
		}
		return next(ctx, cmds)
	}
}

// The key's slot moves after the store read it under WATCH and before its
// MULTI…EXEC: a graceful failover (every queued command answers MOVED,
// EXEC answers EXECABORT), or the slot starting to migrate (the new lease
// record answers ASK) and finishing 200ms later. The allocation is retried
// as a conflict and grants once, on the slot's new master.
func TestClusterSlotMovesBetweenWatchAndExec(t *testing.T) {
	for _, tt := range []struct {
		name string
		// move starts moving key's slot and returns its next master and
		// a channel that reports when the move is over.
		move func(t *testing.T, c *redistest.Cluster, key string) (*redisproc.Server, <-chan error)
	}{
		{"failover", func(t *testing.T, c *redistest.Cluster, key string) (*redisproc.Server, <-chan error) {
			ctx := context.Background()
			old, replicas, err := c.MasterOf(ctx, key)
			require.NoError(t, err)
			require.NoError(t, clusterDo(ctx, replicas[0], "cluster", "failover"))
			promoted, err := c.WaitPromoted(ctx, key, old)
			require.NoError(t, err)
			done := make(chan error, 1)
			done <- nil
			return promoted, done
		}},
		{"migration", func(t *testing.T, c *redistest.Cluster, key string) (*redisproc.Server, <-chan error) {
			ctx := context.Background()
			source, _, err := c.MasterOf(ctx, key)
			require.NoError(t, err)
			target := c.Nodes[0]
			if target == source {
				target = c.Nodes[1]
			}
			slot, err := c.Slot(ctx, key)
			require.NoError(t, err)
			require.NoError(t, clusterDo(ctx, target, "cluster", "setslot", slot, "importing", c.ID(source)))
			require.NoError(t, clusterDo(ctx, source, "cluster", "setslot", slot, "migrating", c.ID(target)))
			done := make(chan error, 1)
			go func() {
				time.Sleep(200 * time.Millisecond)
				done <- finishMigration(ctx, c, source, target, slot)
			}()
			return target, done
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := redistest.StartClusterN(t, 3, 1)
			rdb := c.Client(t)
			key := clusterKeys.Key("k")
			var (
				newMaster *redisproc.Server
				moved     <-chan error
				once      sync.Once
			)
			rdb.OnNewNode(func(node *redis.Client) {
				node.AddHook(beforeMulti{once: &once, move: func() { newMaster, moved = tt.move(t, c, key) }})
			})
			store, err := optimistic.New(rdb, &optimistic.Options{MaxElapsed: 10 * time.Second, MaxRetries: 30})
			require.NoError(t, err)
			syncKeys(t, store, map[string]int{"k": 1})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			lease, stats, err := store.Allocate(ctx, optimistic.AllocateRequest{Provider: "p", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute})
			require.NoError(t, err)
			require.NotNil(t, newMaster, "the slot moved during the allocation")
			require.NoError(t, <-moved)
			require.Positive(t, stats.Conflicts, "the refused transaction counted as a conflict")
			require.NoError(t, c.WaitHealthy(ctx), "every node has learnt the slot's new master")
			m, _, err := c.MasterOf(ctx, key)
			require.NoError(t, err)
			require.Equal(t, newMaster, m)
			info, err := store.Inspect(ctx, "k")
			require.NoError(t, err)
			require.Equal(t, 1, info[0].Live, "granted once")
			require.Equal(t, lease.Fence, info[0].Fence)
			_, _, err = store.Allocate(ctx, optimistic.AllocateRequest{Provider: "p", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute})
			require.ErrorIs(t, err, optimistic.ErrNoCapacity, "the limit of 1 holds on the new master")
			require.NoError(t, store.Release(ctx, lease.LeaseRef))
		})
	}
}
