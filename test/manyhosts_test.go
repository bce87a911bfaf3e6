package test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/test/pgtest"
	"github.com/credpool/credpool/test/redistest"
)

// The deployment of "Running on many hosts", on one machine: three
// services sharing one PostgreSQL catalog and a 3-master Redis Cluster
// with two replicas each (so that a promoted replica still has one to
// acknowledge its grants), replica acknowledgement on, 64 callers spread
// over the services. Under load, a key is disabled through one service,
// then the replication links of one master are cut (its replicas stopped),
// the master is killed with SIGKILL, and a replica, resumed, takes over.
// The other masters' keys have room for every caller (6 keys of limit 8
// on each), so no allocate may fail at all: not while the replication
// links are cut (a grant no replica acknowledges is given back and the
// next key tried), not while the master is down (its keys are skipped),
// not while the slot map changes. By the callers' own clocks (holding from
// a grant's answer to the report that releases it) no key ever had more
// holders than its limit, no fencing token was handed out twice, and the
// disabled key was never granted to a request that started after the
// disable returned.
func TestManyHosts(t *testing.T) {
	pg := pgtest.URL(t)
	c := redistest.StartClusterN(t, 3, 2)
	addrs := c.Addrs()
	url := "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	var services []*service
	for range 3 {
		services = append(services, startService(t, serviceOptions{postgres: pg, redisURL: url, redisCluster: true, minReplicas: 1}))
	}
	const limit = 8
	victim := c.Nodes[0]
	taken := map[string]bool{}
	onVictim := map[string]bool{}
	for _, m := range c.Nodes[:3] {
		for range 6 {
			id := keyOn(t, c, m, taken)
			services[0].putKey(t, id, "default", limit, nil)
			onVictim[id] = m == victim
		}
	}
	_, replicas, err := c.MasterOf(t.Context(), clusterKeys.Key(firstKey(onVictim, true)))
	require.NoError(t, err)
	require.Len(t, replicas, 2)

	var (
		mu       sync.Mutex
		holders  = map[string]int{}
		fences   = map[string]bool{}
		problems []string
		grants   []hostGrant
		failures []string
		begin    = time.Now()
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 15 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	for i := range 64 {
		s := services[i%len(services)]
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				code, g, err := post(client, s.url+"/api/internal/allocate-key", internalKey, allocBody("default"))
				if err != nil {
					mu.Lock()
					problems = append(problems, err.Error())
					mu.Unlock()
					return
				}
				if code != http.StatusOK {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%v: %d %v", time.Since(begin).Round(time.Millisecond), code, g["error"]))
					mu.Unlock()
					time.Sleep(5 * time.Millisecond)
					continue
				}
				key, _ := g["key_id"].(string)
				fence := fmt.Sprintf("%s/%.0f", key, g["fencing_token"])
				mu.Lock()
				holders[key]++
				if holders[key] > limit {
					problems = append(problems, fmt.Sprintf("%s has %d holders", key, holders[key]))
				}
				if fences[fence] {
					problems = append(problems, "fencing token handed out twice: "+fence)
				}
				fences[fence] = true
				grants = append(grants, hostGrant{key: key, start: start, at: time.Now()})
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
				mu.Lock()
				holders[key]--
				mu.Unlock()
				// A report that fails (the store down) leaves the lease to
				// expire or to the service's release backlog: either way
				// this caller no longer uses it.
				_, _, _ = post(client, s.url+"/api/internal/report", internalKey, withField(leaseBody(g), "outcome", "success"))
			}
		})
	}

	time.Sleep(time.Second)
	disabled := firstKey(onVictim, false)
	services[1].putKey(t, disabled, "default", 3, map[string]any{"status": "disabled"})
	disabledAt := time.Now()

	time.Sleep(time.Second)
	cut := time.Now()
	for _, r := range replicas {
		require.NoError(t, r.Signal(syscall.SIGSTOP), "cut the replication links")
	}
	time.Sleep(500 * time.Millisecond)
	c.Kill(victim)
	for _, r := range replicas {
		require.NoError(t, r.Signal(syscall.SIGCONT))
	}
	promoted, err := c.WaitPromoted(t.Context(), clusterKeys.Key(firstKey(onVictim, true)), victim)
	require.NoError(t, err)
	promotedAt := time.Now()
	waitFor(t, "the dead master's keys granted again", 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, g := range grants {
			if onVictim[g.key] && g.key != disabled && g.start.After(promotedAt) {
				return true
			}
		}
		return false
	})
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()

	require.Empty(t, problems)
	require.Empty(t, failures, "allocates that failed (time since the start; cut at %v, promoted at %v)",
		cut.Sub(begin).Round(time.Millisecond), promotedAt.Sub(begin).Round(time.Millisecond))
	var during, afterDisable int
	for _, g := range grants {
		if g.key == disabled && g.start.After(disabledAt) {
			afterDisable++
		}
		if !onVictim[g.key] && g.start.After(cut) && g.at.Before(promotedAt) {
			during++
		}
	}
	require.Zero(t, afterDisable, "the disabled key granted after the disable returned")
	require.Positive(t, during, "the other masters' keys granted during the outage")
	again := time.Duration(0)
	for _, g := range grants {
		if onVictim[g.key] && g.start.After(promotedAt) && (again == 0 || g.at.Sub(promotedAt) < again) {
			again = g.at.Sub(promotedAt)
		}
	}
	t.Logf("%d grants, %d of them during the outage; %s promoted %v after the cut; the dead master's keys granted again %v after that",
		len(grants), during, promoted.Addr, promotedAt.Sub(cut).Round(time.Millisecond), again.Round(time.Millisecond))
}

type hostGrant struct {
	key       string
	start, at time.Time
}

// firstKey is a key of keys whose value is on, in id order.
func firstKey(keys map[string]bool, on bool) string {
	best := ""
	for id, v := range keys {
		if v == on && (best == "" || id < best) {
			best = id
		}
	}
	return best
}
