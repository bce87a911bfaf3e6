package test

import (
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
// ErrStore, never "no slot".
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

	_, _, err = store.Allocate(ctx, req(dead, dead2))
	require.ErrorIs(t, err, optimistic.ErrStore)
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
}

// The service on a 3-master cluster with one master down (no replica):
// 16 callers allocating and reporting over HTTP get every request granted
// from the keys of the masters that answer; /readyz says degraded and how
// many nodes are down, the metrics name the node, and the log says so
// once.
func TestHTTPPartialOutage(t *testing.T) {
	c := redistest.StartClusterN(t, 3, 0)
	addrs := c.Addrs()
	url := "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	s := startService(t, serviceOptions{redisURL: url, redisCluster: true})
	victim := c.Nodes[0]
	taken := map[string]bool{}
	for _, m := range c.Nodes {
		for range 3 {
			s.putKey(t, keyOn(t, c, m, taken), "default", 4, nil)
		}
	}
	c.Kill(victim)

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
}
