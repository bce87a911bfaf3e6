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
