package test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/test/redistest"
)

// A master of a Redis Cluster that is down (killed, no replica to take
// over) makes only its own keys unavailable: Inspect marks them
// Unreachable and reads the rest, Allocate skips them and grants from the
// rest, and when only they could have had a slot the call fails with
// ErrStore, never "no slot". A cluster that stops serving (CLUSTERDOWN,
// with cluster-require-full-coverage yes) fails calls as a store failure,
// never as contention.
func TestClusterPartialOutageStore(t *testing.T) {
	c := redistest.StartClusterN(t, 3, 0)
	store, err := optimistic.New(serveClient(t, c), nil)
	require.NoError(t, err)
	ctx := t.Context()
	victim := c.Nodes[0]
	taken := map[string]bool{}
	dead, live := keyOn(t, c, victim, taken), keyOn(t, c, c.Nodes[1], taken)
	dead2, live2 := keyOn(t, c, victim, taken), keyOn(t, c, c.Nodes[2], taken)
	syncKeys(t, store, map[string]int{dead: 1, dead2: 1, live: 1, live2: 1})
	c.Kill(victim)

	infos, err := store.Inspect(ctx, dead, live, dead2, live2)
	require.NoError(t, err, "one master down fails no Inspect")
	for i, want := range []bool{true, false, true, false} {
		require.Equal(t, want, infos[i].Unreachable, infos[i].ID)
		require.Equal(t, !want, infos[i].Exists, infos[i].ID)
	}

	req := func(cands ...string) optimistic.AllocateRequest {
		return optimistic.AllocateRequest{Provider: "p", Pool: "default", Candidates: cands, TTL: time.Minute}
	}
	l, st, err := store.Allocate(ctx, req(dead, live))
	require.NoError(t, err)
	require.Equal(t, live, l.KeyID)
	require.Equal(t, 1, st.Unreachable)

	_, err = store.Inspect(ctx, dead, dead2)
	require.ErrorIs(t, err, optimistic.ErrStore, "no key answered")
	require.ErrorIs(t, err, optimistic.ErrUnreachable, "but the others may")
	_, _, err = store.Allocate(ctx, req(dead, dead2))
	require.ErrorIs(t, err, optimistic.ErrStore)
	require.ErrorIs(t, err, optimistic.ErrUnreachable)
	_, st, err = store.Allocate(ctx, req(dead, live))
	require.ErrorIs(t, err, optimistic.ErrStore, "live is full, dead may have room: the store failed")
	require.NotErrorIs(t, err, optimistic.ErrNoCapacity)
	require.Equal(t, 1, st.Unreachable)

	require.NoError(t, store.Ping(ctx), "two masters answer")
	var down []string
	for _, n := range store.Nodes(ctx) {
		if n.Err != nil {
			down = append(down, n.Addr)
		}
	}
	require.Equal(t, []string{victim.Addr}, down)

	for _, m := range c.Nodes[1:] {
		require.NoError(t, clusterDo(ctx, m, "config", "set", "cluster-require-full-coverage", "yes"))
	}
	waitFor(t, "the cluster refusing to serve", 30*time.Second, func() bool {
		_, _, err := store.Allocate(ctx, req(live2))
		return errors.Is(err, optimistic.ErrStore)
	})
	_, st, err = store.Allocate(ctx, req(live2))
	require.ErrorIs(t, err, optimistic.ErrUnreachable, "CLUSTERDOWN is the store failing")
	require.NotErrorIs(t, err, optimistic.ErrContended)
	require.Zero(t, st.Conflicts, "and no conflict to retry")
}

// The service on a 3-master cluster with one master down (no replica):
// 16 callers allocating and reporting over HTTP get every request granted
// from the keys of the masters that answer; a vip request whose vip keys
// are all on the dead master is served by the default pool; /readyz says
// degraded and how many nodes are down, the metrics name the node, and
// the log says so once. Another instance starts meanwhile: the keys it
// cannot reach are skipped, and it serves the rest.
func TestHTTPPartialOutage(t *testing.T) {
	c := redistest.StartClusterN(t, 3, 0)
	addrs := c.Addrs()
	url := "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	s := startService(t, serviceOptions{redisURL: url, redisCluster: true})
	victim := c.Nodes[0]
	taken := map[string]bool{}
	for _, m := range c.Nodes {
		// More per master than the broker inspects: the dead master's
		// keys, which rank ever higher as they go unused, can fill the
		// whole inspection.
		for range 6 {
			s.putKey(t, keyOn(t, c, m, taken), "default", 4, nil)
		}
	}
	for range 2 {
		s.putKey(t, keyOn(t, c, victim, taken), "vip", 4, nil)
	}
	c.Kill(victim)

	code, _, g := s.internal(t, "allocate-key", allocBody("vip"))
	require.Equal(t, http.StatusOK, code, "%v", g)
	require.Equal(t, "default", g["pool"], "vip's keys are unreachable: the fallback serves")
	code, _, _ = s.internal(t, "release", leaseBody(g))
	require.Equal(t, http.StatusOK, code)

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}, Timeout: 10 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	var (
		mu    sync.Mutex
		codes = map[int]int{}
		wg    sync.WaitGroup
	)
	for range 16 {
		wg.Go(func() {
			for range 25 {
				code, g, err := post(client, s.url+"/api/internal/allocate-key", internalKey, allocBody("default"))
				if err == nil && code == http.StatusOK {
					_, _, err = post(client, s.url+"/api/internal/report", internalKey, withField(leaseBody(g), "outcome", "success"))
				}
				mu.Lock()
				if err != nil {
					code = -1
				}
				codes[code]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Equal(t, map[int]int{http.StatusOK: 16 * 25}, codes, "every allocate granted from the masters that answer")

	waitFor(t, "degraded in /readyz", 10*time.Second, func() bool {
		code, _, body := s.call(t, http.MethodGet, "/readyz", "", "", nil)
		return code == http.StatusOK && body["status"] == "degraded" &&
			fmt.Sprint(body["store_nodes"]) == fmt.Sprint(map[string]any{"up": 2.0, "down": 1.0})
	})
	resp, err := http.Get(s.url + "/metrics")
	require.NoError(t, err)
	metrics, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Contains(t, string(metrics), fmt.Sprintf("credpool_store_node_up{node=%q} 0", victim.Addr))
	time.Sleep(2 * time.Second) // two more checks: still logged once
	require.Equal(t, 1, strings.Count(s.logs.String(), "lease store node down"), "logged once per node")

	late := startService(t, serviceOptions{redisURL: url, redisCluster: true, dir: s.dir})
	require.Contains(t, late.logs.String(), "keys not synced")
	code, _, g = late.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusOK, code, "%v", g)
}

// A cluster master that answers but takes no writes (too few replicas for
// its min-replicas-to-write here; maxmemory reached or a failed save
// refuse the same way) cannot grant, so it is treated as down for its
// keys: Allocate skips them and grants from the others, a release there
// fails as unreachable (the service's backlog retries it), and Nodes names
// the master, while Ping, which writes nothing, passes. Each check leaves
// one probe key per master, which expires. Once the master takes writes
// again, its keys grant and release.
func TestClusterMasterRefusingWritesStore(t *testing.T) {
	c := redistest.StartClusterN(t, 2, 0)
	store, err := optimistic.New(serveClient(t, c), nil)
	require.NoError(t, err)
	ctx := t.Context()
	victim := c.Nodes[0]
	taken := map[string]bool{}
	refusing, fine := keyOn(t, c, victim, taken), keyOn(t, c, c.Nodes[1], taken)
	syncKeys(t, store, map[string]int{refusing: 2, fine: 2})
	req := func(cands ...string) optimistic.AllocateRequest {
		return optimistic.AllocateRequest{Provider: "p", Pool: "default", Candidates: cands, TTL: time.Minute}
	}
	held, _, err := store.Allocate(ctx, req(refusing))
	require.NoError(t, err)
	down := func() []string {
		var out []string
		for _, n := range store.Nodes(ctx) {
			if n.Err != nil {
				out = append(out, n.Addr+": "+n.Err.Error())
			}
		}
		return out
	}
	require.Empty(t, down())

	require.NoError(t, clusterDo(ctx, victim, "config", "set", "min-replicas-to-write", "1"))
	l, st, err := store.Allocate(ctx, req(refusing, fine))
	require.NoError(t, err, "the other master grants")
	require.Equal(t, fine, l.KeyID)
	require.Equal(t, 1, st.Unreachable)
	_, _, err = store.Allocate(ctx, req(refusing))
	require.ErrorIs(t, err, optimistic.ErrStore)
	require.ErrorIs(t, err, optimistic.ErrUnreachable)
	require.NotErrorIs(t, err, optimistic.ErrNoCapacity, "a key with room whose master refuses writes is not full")
	err = store.Release(ctx, held.LeaseRef)
	require.ErrorIs(t, err, optimistic.ErrUnreachable, "a caller with other keys to release goes on")
	require.ErrorContains(t, err, "NOREPLICAS")
	require.NoError(t, store.Ping(ctx), "it answers pings")
	refusals := down()
	require.Len(t, refusals, 1, "%v", refusals)
	require.Contains(t, refusals[0], victim.Addr+": refuses writes: NOREPLICAS")

	for _, m := range c.Nodes {
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr})
		keys, err := rdb.Keys(ctx, clusterKeys.Probe("*")).Result()
		require.NoError(t, err)
		require.Len(t, keys, 1, "one probe key per master, however many checks")
		ttl, err := rdb.PTTL(ctx, keys[0]).Result()
		require.NoError(t, err)
		require.Positive(t, ttl, "it expires")
		require.NoError(t, rdb.Close())
	}

	require.NoError(t, clusterDo(ctx, victim, "config", "set", "min-replicas-to-write", "0"))
	require.Empty(t, down())
	require.NoError(t, store.Release(ctx, held.LeaseRef))
	l, _, err = store.Allocate(ctx, req(refusing))
	require.NoError(t, err)
	require.Equal(t, refusing, l.KeyID)
}

// The service on a 2-master cluster whose masters answer but refuse
// writes (too few replicas for min-replicas-to-write), one and then both:
// with one, allocates are granted from the other master's keys and
// /readyz says degraded, the metrics name the node; with both, /readyz
// says unavailable and an allocate is the store's failure (503), never
// "full" (429). Pings pass throughout: only the checks' writes see it.
func TestHTTPMastersRefusingWrites(t *testing.T) {
	c := redistest.StartClusterN(t, 2, 0)
	addrs := c.Addrs()
	s := startService(t, serviceOptions{redisURL: "redis://" + addrs[0] + "?addr=" + addrs[1], redisCluster: true})
	taken := map[string]bool{}
	for _, m := range c.Nodes {
		for range 2 {
			s.putKey(t, keyOn(t, c, m, taken), "default", 2, nil)
		}
	}
	readyz := func() (int, map[string]any) {
		code, _, body := s.call(t, http.MethodGet, "/readyz", "", "", nil)
		return code, body
	}
	refuse := func(m int, n string) {
		require.NoError(t, clusterDo(t.Context(), c.Nodes[m], "config", "set", "min-replicas-to-write", n))
	}

	refuse(0, "1")
	waitFor(t, "degraded in /readyz", 10*time.Second, func() bool {
		code, body := readyz()
		return code == http.StatusOK && body["status"] == "degraded" &&
			fmt.Sprint(body["store_nodes"]) == fmt.Sprint(map[string]any{"up": 1.0, "down": 1.0})
	})
	for range 8 {
		code, _, g := s.internal(t, "allocate-key", allocBody("default"))
		require.Equal(t, http.StatusOK, code, "%v", g)
		code, _, out := s.internal(t, "release", leaseBody(g))
		require.Equal(t, http.StatusOK, code, "%v", out)
	}
	up, ok := s.metric(t, fmt.Sprintf("credpool_store_node_up{node=%q}", c.Nodes[0].Addr))
	require.True(t, ok)
	require.Zero(t, up)
	require.Regexp(t, `lease store node down or refusing writes[^\n]*NOREPLICAS`, s.logs.String(), "the log says why")

	refuse(1, "1")
	waitFor(t, "unavailable in /readyz", 10*time.Second, func() bool {
		code, body := readyz()
		return code == http.StatusServiceUnavailable && body["error"] == "store_unavailable"
	})
	code, _, out := s.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusServiceUnavailable, code, "no master takes the grant: %v", out)
	require.Equal(t, "store_unavailable", errCode(out))

	refuse(0, "0")
	refuse(1, "0")
	waitFor(t, "ready again", 10*time.Second, func() bool {
		code, body := readyz()
		return code == http.StatusOK && body["status"] == "ok"
	})
	code, _, out = s.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusOK, code, "%v", out)
}

// Slots that nobody serves (a dead master without a replica forgotten by
// the others; here its first 1,000 slots unassigned) leave the masters
// that serve the rest up: each probe writes on a slot its master serves,
// never on one that would answer CLUSTERDOWN.
func TestClusterNodesSkipUnservedSlots(t *testing.T) {
	c := redistest.StartClusterN(t, 2, 0)
	store, err := optimistic.New(serveClient(t, c), nil)
	require.NoError(t, err)
	ctx := t.Context()
	for _, m := range c.Nodes {
		require.NoError(t, clusterDo(ctx, m, "cluster", "delslotsrange", 0, 999))
	}
	for range 5 {
		for _, n := range store.Nodes(ctx) {
			require.NoError(t, n.Err, n.Addr)
		}
	}
}
