package test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/redisschema"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/test/redistest"
)

// waitFor polls cond, bounded, for an effect the service brings about in
// the background.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still not %s after %s", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// storeOutage runs the same story on a store that fails and comes back:
// a held slot's release meets the outage (503, kept for retrying); an
// allocate on the now-full key is the store's fault (503), never "full"
// (429); /readyz says unavailable, allocates coming or not; once the
// store is back the slot returns by itself, in seconds, not at the
// lease's expiry, and /readyz says ok.
func storeOutage(t *testing.T, s *service, fail, recover func()) {
	s.putKey(t, "k", "default", 1, nil)
	code, _, g := s.internal(t, "allocate-key", withField(allocBody("default"), "lease_seconds", 3600))
	require.Equal(t, http.StatusOK, code, "%v", g)

	fail()
	code, _, out := s.internal(t, "release", leaseBody(g))
	require.Equal(t, http.StatusServiceUnavailable, code, "%v", out)
	require.Equal(t, "store_unavailable", errCode(out))
	for range 3 {
		code, _, out = s.internal(t, "allocate-key", allocBody("default"))
		require.NotEqual(t, http.StatusTooManyRequests, code, "a broken store answered 429: %v", out)
		require.Equal(t, http.StatusServiceUnavailable, code, "%v", out)
		require.Equal(t, "store_unavailable", errCode(out))
	}
	waitFor(t, "not ready, while allocates keep coming", 10*time.Second, func() bool {
		code, _, out := s.internal(t, "allocate-key", allocBody("default"))
		require.Equal(t, http.StatusServiceUnavailable, code, "%v", out)
		code, _, out = s.call(t, http.MethodGet, "/readyz", "", "", nil)
		return code == http.StatusServiceUnavailable && out["error"] == "store_unavailable"
	})
	recover()
	waitFor(t, "granted again after the store came back", 20*time.Second, func() bool {
		code, _, _ := s.internal(t, "allocate-key", allocBody("default"))
		return code == http.StatusOK
	})
	waitFor(t, "ready again", 10*time.Second, func() bool {
		code, _, out := s.call(t, http.MethodGet, "/readyz", "", "", nil)
		return code == http.StatusOK && out["status"] == "ok"
	})
}

// Redis unreachable (the network to it cut, its data intact).
func TestHTTPRedisOutageGivesSlotsBack(t *testing.T) {
	s := startService(t, serviceOptions{proxied: true})
	storeOutage(t, s, func() { s.proxy.SetDown(true) }, func() { s.proxy.SetDown(false) })
}

// An admin write that the catalog took and the store did not is 503, and
// the same call again finishes it: a put syncs the key, and a delete
// clears what the store still has and answers 200, not 404.
func TestHTTPAdminWriteRetriedAfterAStoreOutage(t *testing.T) {
	s := startService(t, serviceOptions{proxied: true})
	s.putKey(t, "k", "default", 1, nil)
	code, _, g := s.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusOK, code, "%v", g)

	s.proxy.SetDown(true)
	code, out := s.admin(t, http.MethodDelete, "keys/k", nil)
	require.Equal(t, http.StatusServiceUnavailable, code, "%v", out)
	s.proxy.SetDown(false)
	waitFor(t, "the store back", 20*time.Second, func() bool {
		code, _, _ := s.call(t, http.MethodGet, "/readyz", "", "", nil)
		return code == http.StatusOK
	})
	require.NotEmpty(t, s.redis.Find(t, ":key:{k}"), "the store missed the delete")
	code, out = s.admin(t, http.MethodDelete, "keys/k", nil)
	require.Equal(t, http.StatusOK, code, "%v", out)
	require.Empty(t, s.redis.Find(t, "{k}"))
	code, out = s.admin(t, http.MethodDelete, "keys/k", nil)
	require.Equal(t, http.StatusNotFound, code, "%v", out)
	require.Equal(t, "key_not_found", errCode(out))
	code, _, out = s.internal(t, "release", leaseBody(g))
	require.Equal(t, http.StatusOK, code, "%v", out)
	require.Equal(t, false, out["released"], "its holder lost it")
}

// Redis silent: the network drops packets and sends no reset, so only the
// client's own timeouts notice. They must make it a store failure well
// inside the request's deadline, not a 503 "timeout".
func TestHTTPRedisBlackholeGivesSlotsBack(t *testing.T) {
	s := startService(t, serviceOptions{proxied: true})
	storeOutage(t, s, func() { s.proxy.SetBlackhole(true) }, func() { s.proxy.SetBlackhole(false) })
}

// Redis that answers reads but refuses writes (the service's address
// moved to a read-only replica): the release fails and waits in the
// backlog, so the limit-1 key looks full. An allocate must blame the store
// (503), not the callers (429); /readyz, whose ping still passes, says
// unavailable from the next check's write on; and the slot returns once
// writes work.
func TestHTTPRedisRefusingWritesIsNotFull(t *testing.T) {
	master := redistest.Start(t)
	replica := redistest.StartReplica(t, master.Addr)
	s := startService(t, serviceOptions{redis: master, proxied: true})
	s.putKey(t, "k", "default", 1, nil)
	code, _, g := s.internal(t, "allocate-key", withField(allocBody("default"), "lease_seconds", 3600))
	require.Equal(t, http.StatusOK, code, "%v", g)
	acked, err := master.Client(t).Do(t.Context(), "wait", 1, 5000).Int()
	require.NoError(t, err)
	require.Equal(t, 1, acked, "the replica has the lease")

	s.proxy.SetTarget(replica.Addr)
	code, _, out := s.internal(t, "release", leaseBody(g))
	require.Equal(t, http.StatusServiceUnavailable, code, "%v", out)
	require.Equal(t, "store_unavailable", errCode(out))
	code, _, out = s.internal(t, "allocate-key", allocBody("default"))
	require.NotEqual(t, http.StatusTooManyRequests, code, "full only because the store refuses the release: %v", out)
	require.Equal(t, http.StatusServiceUnavailable, code, "%v", out)
	require.Equal(t, "store_unavailable", errCode(out))
	waitFor(t, "not ready while writes are refused", 10*time.Second, func() bool {
		code, _, out := s.call(t, http.MethodGet, "/readyz", "", "", nil)
		return code == http.StatusServiceUnavailable && out["error"] == "store_unavailable"
	})
	require.Regexp(t, `lease store node down or refusing writes[^\n]*READONLY`, s.logs.String(), "the log says why")

	s.proxy.SetTarget(master.Addr)
	waitFor(t, "granted again once writes work", 20*time.Second, func() bool {
		code, _, _ := s.internal(t, "allocate-key", allocBody("default"))
		return code == http.StatusOK
	})
	waitFor(t, "ready again", 10*time.Second, func() bool {
		code, _, out := s.call(t, http.MethodGet, "/readyz", "", "", nil)
		return code == http.StatusOK && out["status"] == "ok"
	})
}

// With --redis-min-replicas, a grant counts only once that many replicas
// have it. Without them every grant is given back (503), so /readyz says
// unavailable, although Redis answers and takes writes; it is ready again
// once a replica is back.
func TestHTTPReadyzWantsTheReplicasGrantsNeed(t *testing.T) {
	master := redistest.Start(t)
	replica := redistest.StartReplica(t, master.Addr)
	s := startService(t, serviceOptions{redis: master, minReplicas: 1})
	s.putKey(t, "k", "default", 1, nil)
	ready := func() (int, map[string]any) {
		code, _, out := s.call(t, http.MethodGet, "/readyz", "", "", nil)
		return code, out
	}
	code, out := ready()
	require.Equal(t, http.StatusOK, code, "%v", out)

	replica.Stop()
	waitFor(t, "not ready without the replica", 10*time.Second, func() bool {
		code, out := ready()
		return code == http.StatusServiceUnavailable && out["error"] == "store_unavailable"
	})
	code, _, out = s.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusServiceUnavailable, code, "%v", out)

	redistest.StartReplica(t, master.Addr)
	waitFor(t, "ready with a replica again", 20*time.Second, func() bool {
		code, _ := ready()
		return code == http.StatusOK
	})
	// A replica just in sync may miss a WAIT or two while the master
	// waits for its first acknowledgement to stream to it.
	waitFor(t, "granted again", 10*time.Second, func() bool {
		code, _, _ := s.internal(t, "allocate-key", allocBody("default"))
		return code == http.StatusOK
	})
}

// The SQLite file's disk full: releases cannot write, while an allocate on
// a full key would write nothing and answer "no slot".
func TestHTTPDiskFullGivesSlotsBack(t *testing.T) {
	dir := smallTmpfs(t, "4m")
	s := startService(t, serviceOptions{sqlite: true, dir: dir})
	filler := filepath.Join(dir, "filler")
	storeOutage(t, s, func() { fillDisk(t, filler) }, func() { require.NoError(t, os.Remove(filler)) })
}

// smallTmpfs mounts a tmpfs of the given size on a fresh directory for the
// test: a disk that can really fill up. Mounting needs root (as CI runs).
func smallTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", dir).CombinedOutput()
	require.NoError(t, err, "the disk-full test mounts a small tmpfs, which needs root (CI runs as root): %s", out)
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fillDisk writes path until its file system has no space left.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			require.True(t, errors.Is(err, syscall.ENOSPC), "filling the disk: %v", err)
			return
		}
	}
}

// use is one caller's use of a granted key, by the caller's clock: from
// the answer to the release it sent, or to the lease's end if it "crashed"
// and never released.
type use struct {
	key        string
	fence      int64
	start, end time.Time
}

// overlaps returns the most uses of key that were ever under way at once,
// and a fencing token handed out twice, if any.
func overlaps(uses []use, key string) (most int, dup int64) {
	type event struct {
		at    time.Time
		delta int
	}
	var events []event
	seen := map[int64]bool{}
	for _, u := range uses {
		if u.key != key {
			continue
		}
		if seen[u.fence] {
			dup = u.fence
		}
		seen[u.fence] = true
		events = append(events, event{u.start, 1}, event{u.end, -1})
	}
	slices.SortFunc(events, func(a, b event) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // an end before a start at the same instant
	})
	n := 0
	for _, e := range events {
		n += e.delta
		most = max(most, n)
	}
	return most, dup
}

// audited runs 8 callers against s on keys of the given limits while
// events happens, then checks, by the callers' own clocks, that no key
// ever had more users than its limit and no fencing token was handed out
// twice. A caller holds a granted key for up to 20ms and releases it, or
// one time in ten "crashes" and uses it until its lease ends. It returns
// how many grants there were before each mark events called.
func audited(t *testing.T, s *service, limits map[string]int, leaseSeconds int, events func(mark func())) []int64 {
	t.Helper()
	for id, n := range limits {
		s.putKey(t, id, "default", n, nil)
	}
	var (
		mu      sync.Mutex
		uses    []use
		granted atomic.Int64
		marks   []int64
		errs    = make(chan error, 16)
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	body := withField(allocBody("default"), "lease_seconds", leaseSeconds)
	for w := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for {
				select {
				case <-stop:
					return
				default:
				}
				code, g, err := s.post("/api/internal/allocate-key", internalKey, body)
				if err != nil {
					errs <- err
					return
				}
				if code != http.StatusOK {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				granted.Add(1)
				u := use{key: g["key_id"].(string), fence: int64(g["fencing_token"].(float64)), start: time.Now()}
				time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
				if rng.IntN(10) == 0 {
					// Crashed: never released, "in use" until the lease ends.
					u.end, _ = time.Parse(time.RFC3339Nano, g["lease_until"].(string))
				} else {
					u.end = time.Now()
					_, _, _ = s.post("/api/internal/release", internalKey, leaseBody(g))
				}
				mu.Lock()
				uses = append(uses, u)
				mu.Unlock()
			}
		})
	}
	events(func() { marks = append(marks, granted.Load()) })
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for id, limit := range limits {
		most, dup := overlaps(uses, id)
		require.LessOrEqual(t, most, limit, "%s: %d users at once", id, most)
		require.Zero(t, dup, "%s: fencing token %d handed out twice", id, dup)
	}
	t.Logf("%d grants, %d uses audited", granted.Load(), len(uses))
	return append(marks, granted.Load())
}

// Redis loses everything twice under load: a FLUSHALL, then a crash and a
// restart without persistence. Callers that hold leases the store forgot
// keep using them; the service must hold those keys back until every such
// lease has ended.
func TestHTTPRedisLosesStateUnderLoad(t *testing.T) {
	const maxLease = 2 * time.Second
	s := startService(t, serviceOptions{maxLease: maxLease})
	rdb := s.redis.Client(t)
	var (
		ready        map[string]any // /readyz during the flush's quarantine
		held         int            // an allocate's status then
		heldCode     string
		retryAfter   string
		retryAfterAt time.Time
		sent         time.Time
		lostKeys     float64
		body         = withField(allocBody("default"), "lease_seconds", 2)
	)
	marks := audited(t, s, map[string]int{"k1": 1, "k2": 2, "k3": 2}, 2, func(mark func()) {
		time.Sleep(1500 * time.Millisecond)
		mark()
		require.NoError(t, rdb.FlushAll(t.Context()).Err())
		flushed := time.Now()
		// The callers' next allocate finds the keys lost: every one is held
		// back, and the service says so, until the quarantine ends.
		// The catalog's quarantine comes before the count: wait for both.
		waitFor(t, "degraded after the flush, and counted", maxLease, func() bool {
			_, _, ready = s.call(t, http.MethodGet, "/readyz", "", "", nil)
			lostKeys, _ = s.metric(t, "credpool_store_lost_keys_total")
			return ready["status"] == "degraded" && lostKeys >= 1
		})
		var h http.Header
		var out map[string]any
		sent = time.Now()
		held, h, out = s.internal(t, "allocate-key", body)
		heldCode, retryAfter, retryAfterAt = errCode(out), h.Get("Retry-After"), time.Now()
		time.Sleep(4*time.Second - time.Since(flushed)) // a 2s quarantine, with room to spare
		mark()
		s.redis = s.redis.Restart(t)
		time.Sleep(4 * time.Second)
	})
	require.Positive(t, marks[0], "grants before the flush")
	require.Greater(t, marks[1], marks[0], "grants after the flush's quarantine")
	require.Greater(t, marks[2], marks[1], "grants after the restart's quarantine")

	lost, _ := ready["store_lost_keys"].(map[string]any)
	require.GreaterOrEqual(t, lost["held"], float64(1), "/readyz: %v", ready)
	until, err := time.Parse(time.RFC3339Nano, lost["until"].(string))
	require.NoError(t, err)
	require.GreaterOrEqual(t, lostKeys, float64(1), "credpool_store_lost_keys_total")
	require.Equal(t, http.StatusTooManyRequests, held, "an allocate while every key is held back")
	require.Equal(t, "pool_exhausted", heldCode)
	wait, err := strconv.Atoi(retryAfter)
	require.NoError(t, err, "Retry-After %q", retryAfter)
	// Whole seconds to the quarantine's end, by the server's clock at some
	// moment between sending and the answer (its end by the store may be
	// a little later than the catalog's).
	require.GreaterOrEqual(t, float64(wait), until.Sub(retryAfterAt).Seconds()-0.5, "Retry-After is the quarantine's end")
	require.LessOrEqual(t, float64(wait), until.Sub(sent).Seconds()+1.5, "Retry-After is the quarantine's end")
}

// Redis restarts from a snapshot older than its last writes, under load
// (a SAVE, a second of grants, a crash, a restart that loads the
// snapshot): the keys come back without the leases granted since, which
// their holders still use. The service saw those grants: it finds each
// key behind, holds it back until every lease it may have lost has ended
// and says so; no key ever has more users than its limit.
func TestHTTPRedisRestartsFromOlderStateUnderLoad(t *testing.T) {
	const maxLease = 4 * time.Second
	s := startService(t, serviceOptions{maxLease: maxLease})
	var (
		ready    map[string]any
		lostKeys float64
	)
	marks := audited(t, s, map[string]int{"k1": 1, "k2": 2, "k3": 2}, 2, func(mark func()) {
		time.Sleep(1500 * time.Millisecond)
		require.NoError(t, s.redis.Client(t).Save(t.Context()).Err())
		time.Sleep(time.Second)
		mark()
		s.redis = s.redis.Restart(t)
		// The catalog's quarantine comes before the count: wait for both.
		waitFor(t, "degraded after the restart, and counted", maxLease, func() bool {
			_, _, ready = s.call(t, http.MethodGet, "/readyz", "", "", nil)
			lostKeys, _ = s.metric(t, "credpool_store_lost_keys_total")
			return ready["status"] == "degraded" && lostKeys >= 1
		})
		time.Sleep(maxLease + 2*time.Second) // the hold, with room to spare
	})
	require.Greater(t, marks[0], int64(0), "grants before the restart")
	require.Greater(t, marks[1], marks[0], "grants after the hold")
	lost, _ := ready["store_lost_keys"].(map[string]any)
	require.GreaterOrEqual(t, lost["held"], float64(1), "/readyz: %v", ready)
	require.GreaterOrEqual(t, lostKeys, float64(1), "credpool_store_lost_keys_total")
	require.LessOrEqual(t, lostKeys, float64(3), "each key counted once")
}

// A key held back after a restart from an older state is quarantined in
// the catalog (so every instance agrees, and /readyz says so) even while
// the pool has room elsewhere and no allocate comes up empty: the ranking
// read that finds the hold records it. The key whose lease the restart
// lost is never granted meanwhile.
func TestHTTPHeldKeyIsQuarantinedWhileThePoolHasRoom(t *testing.T) {
	s := startService(t, serviceOptions{maxLease: 5 * time.Second})
	s.putKey(t, "a", "default", 1, nil)
	s.putKey(t, "b", "default", 1, nil)
	body := withField(allocBody("default"), "lease_seconds", 5)
	require.NoError(t, s.redis.Client(t).Save(t.Context()).Err())
	code, _, g := s.internal(t, "allocate-key", body)
	require.Equal(t, http.StatusOK, code, "%v", g)
	lost := g["key_id"]
	s.redis = s.redis.Restart(t)

	var ready map[string]any
	waitFor(t, "degraded after the restart", 4*time.Second, func() bool {
		code, _, g := s.internal(t, "allocate-key", body)
		require.Equal(t, http.StatusOK, code, "the other key has room: %v", g)
		require.NotEqual(t, lost, g["key_id"], "the key whose lease was lost is held back")
		code, _, _ = s.internal(t, "release", leaseBody(g))
		require.Equal(t, http.StatusOK, code)
		_, _, ready = s.call(t, http.MethodGet, "/readyz", "", "", nil)
		return ready["status"] == "degraded"
	})
	held, _ := ready["store_lost_keys"].(map[string]any)
	require.Equal(t, float64(1), held["held"], "/readyz: %v", ready)
	// The catalog's quarantine comes before the count.
	var lostKeys float64
	waitFor(t, "counted", 4*time.Second, func() bool {
		lostKeys, _ = s.metric(t, "credpool_store_lost_keys_total")
		return lostKeys >= 1
	})
	require.Equal(t, float64(1), lostKeys)
}

// A failover to a replica that missed the last writes: the replication
// link is cut, the master dies, the replica is promoted, the service's
// address moves to it and a new replica joins it (as the old master would,
// back from its crash). A grant made while the link was cut is unknown to
// the replica, which would hand the slot out again. With MinReplicas 1
// that grant is refused (503) instead, so a limit-1 key never has two
// holders, and the key stays in service.
func TestHTTPFailoverToLaggingReplica(t *testing.T) {
	holders, second := failover(t, 1)
	require.Equal(t, http.StatusOK, second, "the promoted replica grants")
	require.Equal(t, 1, holders, "one holder after the failover")
}

// Without acknowledgements the same failover loses the first grant (the
// promoted replica has no lease on the key). The service, which saw that
// grant, finds the key behind it and holds it back (429, for the max
// lease) instead of handing it to a second caller: one holder still, but
// the key is out of service until the lost lease has surely ended.
func TestHTTPFailoverWithoutAcksHoldsTheKeyBack(t *testing.T) {
	holders, second := failover(t, 0)
	require.Equal(t, http.StatusTooManyRequests, second, "the key is held back")
	require.Equal(t, 1, holders, "the lost grant's holder alone")
}

// failover runs that story with the store's MinReplicas set to acks and
// returns how many callers hold the limit-1 key at the end, and the status
// of the allocate after the failover.
func failover(t *testing.T, acks int) (holders, second int) {
	master := redistest.Start(t)
	link := redistest.NewProxy(t, master.Addr)
	replica := redistest.StartReplica(t, link.Addr)
	s := startService(t, serviceOptions{redis: master, proxied: true, minReplicas: acks, maxLease: 60 * time.Second})
	s.putKey(t, "solo", "default", 1, nil)
	rdb := master.Client(t)
	require.NoError(t, rdb.Do(t.Context(), "wait", 1, 5000).Err(), "the replica has the key")
	body := withField(allocBody("default"), "lease_seconds", 60)

	link.SetDown(true)
	first, _, g := s.internal(t, "allocate-key", body)
	if acks > 0 {
		require.Equal(t, http.StatusServiceUnavailable, first, "an unreplicated grant is refused: %v", g)
		live, err := rdb.ZCard(t.Context(), leasesKey("solo")).Result()
		require.NoError(t, err)
		require.Zero(t, live, "the refused grant was given back on the master")
		// The service reads the key on the master, grant count of the
		// refused grant included: with acknowledgements only grants
		// count as seen, so the failover that loses it is no loss.
		code, k := s.admin(t, http.MethodGet, "keys/solo", nil)
		require.Equal(t, http.StatusOK, code, "%v", k)
	}
	master.Stop()
	require.NoError(t, replica.Client(t).SlaveOf(t.Context(), "NO", "ONE").Err())
	s.proxy.SetTarget(replica.Addr)
	redistest.StartReplica(t, replica.Addr)
	// The new replica has synced before the next grant asks it to
	// acknowledge (a loaded machine may take longer than WAIT's timeout).
	n, err := replica.Client(t).Do(t.Context(), "wait", 1, 10000).Int()
	require.NoError(t, err)
	require.Equal(t, 1, n, "the new replica joined")
	live, err := replica.Client(t).ZCard(t.Context(), leasesKey("solo")).Result()
	require.NoError(t, err)
	require.Zero(t, live, "the promoted replica has no lease on the key")

	// A 503 says "retry": the new replica's acknowledgement can miss the
	// 100 ms WAIT on a loaded machine, and the unacknowledged grant is
	// given back, so a retry takes no second slot.
	for range 20 {
		if second, _, g = s.internal(t, "allocate-key", body); second != http.StatusServiceUnavailable {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("after the failover: %d %v", second, g)
	holders = 0
	for _, code := range []int{first, second} {
		if code == http.StatusOK {
			holders++
		}
	}
	return holders, second
}

// A failover after a renewal the replica missed: with MinReplicas 1 the
// renewal is refused (503), so its holder goes by the expiry it had, which
// is what the promoted replica keeps.
func TestHTTPFailoverRefusesUnacknowledgedRenewal(t *testing.T) {
	code, granted, kept := renewalFailover(t, 1)
	require.Equal(t, http.StatusServiceUnavailable, code, "an unreplicated renewal is refused")
	require.Equal(t, granted.UnixMilli(), kept.UnixMilli(), "the promoted replica keeps the expiry the holder goes by")
}

// The control: without acknowledgements the renewal is answered 200 and
// the promoted replica has never heard of it.
func TestHTTPFailoverWithoutAcksLosesRenewal(t *testing.T) {
	code, granted, kept := renewalFailover(t, 0)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, granted.UnixMilli(), kept.UnixMilli(), "the cut link lost the renewal")
}

// renewalFailover grants a lease, replicated; cuts the replication link;
// renews the lease through the service (with the store's MinReplicas set
// to acks); fails over to the replica. It returns the renewal's status,
// the grant's expiry, and the expiry the promoted replica has.
func renewalFailover(t *testing.T, acks int) (code int, granted, kept time.Time) {
	master := redistest.Start(t)
	link := redistest.NewProxy(t, master.Addr)
	replica := redistest.StartReplica(t, link.Addr)
	s := startService(t, serviceOptions{redis: master, proxied: true, minReplicas: acks, maxLease: 60 * time.Second})
	s.putKey(t, "solo", "default", 1, nil)
	code, _, g := s.internal(t, "allocate-key", withField(allocBody("default"), "lease_seconds", 10))
	require.Equal(t, http.StatusOK, code, "%v", g)
	acked, err := master.Client(t).Do(t.Context(), "wait", 1, 5000).Int()
	require.NoError(t, err)
	require.Equal(t, 1, acked, "the replica has the lease")
	granted, err = time.Parse(time.RFC3339Nano, g["lease_until"].(string))
	require.NoError(t, err)

	link.SetDown(true)
	code, _, r := s.internal(t, "renew", withField(leaseBody(g), "lease_seconds", 60))
	require.Contains(t, []int{http.StatusOK, http.StatusServiceUnavailable}, code, "%v", r)
	master.Stop()
	rdb := replica.Client(t)
	require.NoError(t, rdb.SlaveOf(t.Context(), "NO", "ONE").Err())
	member := redisschema.Member(g["lease_id"].(string), "openai", "default")
	score, err := rdb.ZScore(t.Context(), leasesKey("solo"), member).Result()
	require.NoError(t, err, "the promoted replica has the lease")
	return code, granted, time.UnixMilli(int64(score))
}

// leasesKey is the Redis key of a credential's leases.
func leasesKey(keyID string) string {
	return redisschema.Schema{Prefix: redisschema.DefaultPrefix}.Leases(keyID)
}

// post sends body with the internal key and decodes the answer; unlike
// call it reports errors instead of failing t, so goroutines may use it.
func (s *service) post(path, key string, body any) (int, map[string]any, error) {
	return post(http.DefaultClient, s.url+path, key, body)
}

// closing marks the ctx of the service's Close (see releasesAtClose).
type closing struct{}

// releasesAtClose is a lease store whose releases fail as an outage
// would, except those made under Close's ctx: only Close's last round can
// take a release back, never the background's.
type releasesAtClose struct {
	optimistic.LeaseStore
	released atomic.Int32
}

func (s *releasesAtClose) Release(ctx context.Context, ref optimistic.LeaseRef) error {
	if ctx.Value(closing{}) == nil || ctx.Err() != nil {
		return fmt.Errorf("%w: the test's outage", optimistic.ErrStore)
	}
	err := s.LeaseStore.Release(ctx, ref)
	if err == nil {
		s.released.Add(1)
	}
	return err
}

// At shutdown the catalog's last write and the release backlog's last
// round run at once: a catalog that cannot be written (its file locked by
// another connection here, as another process would; a frozen database
// alike) and so takes the whole of Close's time does not cost a release
// waiting for the (Redis) store its last try.
func TestCloseReleasesWhileTheCatalogHangs(t *testing.T) {
	store := &releasesAtClose{}
	s := startService(t, serviceOptions{wrap: func(l optimistic.LeaseStore) optimistic.LeaseStore {
		store.LeaseStore = l
		return store
	}})
	s.putKey(t, "k", "default", 2, nil)
	code, _, g := s.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusOK, code, "%v", g)
	code, _, out := s.internal(t, "release", leaseBody(g))
	require.Equal(t, http.StatusServiceUnavailable, code, "%v", out)

	other, err := sqlitex.Open(filepath.Join(s.dir, "credpool.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	lock, err := other.Conn(t.Context())
	require.NoError(t, err)
	_, err = lock.ExecContext(t.Context(), "BEGIN IMMEDIATE")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = lock.ExecContext(context.Background(), "ROLLBACK")
		_ = lock.Close()
	})
	code, _, out = s.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusOK, code, "a grant writes no catalog row at once: %v", out)

	// Shorter than the catalog write's busy waits and retries, which take
	// all of it; 70% of one busy wait keeps the test short.
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), closing{}, true),
		sqlitex.BusyTimeoutMillis*time.Millisecond*7/10)
	defer cancel()
	s.app.Close(ctx)
	require.Contains(t, s.logs.String(), "uses of the last moments not written", "the catalog took all of Close's time")
	require.Equal(t, int32(1), store.released.Load(), "the release waiting for the store was made at Close")
}

// An instance started on another lease store than the one that served the
// keys (here without Redis: the SQLite store in the catalog's file, as
// `credpool serve` without --redis) grants none of them while leases the
// first store granted may be in use: it holds each key back for the
// longest lease. Clearing a key's leases, the operator's word that none is
// in use, lifts the hold.
func TestHTTPAnotherStoreHoldsKeysBack(t *testing.T) {
	a := startService(t, serviceOptions{})
	a.putKey(t, "k1", "default", 1, nil)
	code, _, out := a.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusOK, code, "%v", out)

	b := startService(t, serviceOptions{sqlite: true, dir: a.dir})
	code, h, out := b.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusTooManyRequests, code, "the lease a's store granted may be in use: %v", out)
	require.Equal(t, "pool_exhausted", errCode(out))
	require.NotEqual(t, "1", h.Get("Retry-After"), "held back until the longest lease ends")

	code, out = b.admin(t, http.MethodPost, "keys/k1/clear-leases", nil)
	require.Equal(t, http.StatusOK, code, "%v", out)
	code, _, out = b.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusOK, code, "lifted: %v", out)
}

// A key held back after the store lost its leases says so in the admin
// API (held_until) until the hold is lifted: its status alone still reads
// available, and it grants nothing.
func TestHTTPAdminShowsAHeldKey(t *testing.T) {
	s := startService(t, serviceOptions{})
	s.putKey(t, "k1", "default", 1, nil)
	code, _, out := s.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusOK, code, "%v", out)
	code, out = s.admin(t, http.MethodGet, "keys/k1", nil)
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, out, "held_until", "not held: %v", out)

	require.NoError(t, s.redis.Client(t).FlushAll(t.Context()).Err())
	code, _, out = s.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusTooManyRequests, code, "the lost lease may be in use: %v", out)

	code, out = s.admin(t, http.MethodGet, "keys/k1", nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "available", out["status"])
	held, ok := out["held_until"].(string)
	require.True(t, ok, "a held key shows its hold: %v", out)
	until, err := time.Parse(time.RFC3339Nano, held)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(broker.DefaultMaxLease), until, time.Minute, "held for the longest lease")
	code, out = s.admin(t, http.MethodGet, "keys", nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, held, out["keys"].([]any)[0].(map[string]any)["held_until"], "the list shows it too")

	code, out = s.admin(t, http.MethodPost, "keys/k1/clear-leases", nil)
	require.Equal(t, http.StatusOK, code, "%v", out)
	code, out = s.admin(t, http.MethodGet, "keys/k1", nil)
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, out, "held_until", "lifted: %v", out)
}
