package test

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/test/pgtest"
	"github.com/credpool/credpool/test/redistest"
)

// redisStoreID is the id the Redis store keeps, "" if none.
func redisStoreID(t *testing.T, r *redistest.Server) string {
	t.Helper()
	return r.Client(t).Get(t.Context(), clusterKeys.StoreID()).Val()
}

// catalogKey is key id as the service's catalog has it.
func (s *service) catalogKey(t *testing.T, id string) catalog.Key {
	t.Helper()
	k, err := s.cat.Key(t.Context(), id)
	require.NoError(t, err)
	return k
}

// shortLease is an allocate body whose lease fits a max lease of 1s.
func shortLease() map[string]any { return withField(allocBody("default"), "lease_seconds", 1) }

// Two instances on one Redis, one reaching it as 127.0.0.1 and the other
// as localhost (a PostgreSQL catalog between them, as on two hosts), are
// one store: the id it keeps names it for both. Neither takes the other's
// keys for another store's, so nothing is held back and the catalog's
// record of the key stays put.
func TestHTTPOneRedisTwoSpellingsIsOneStore(t *testing.T) {
	pg := pgtest.URL(t)
	r := redistest.Start(t)
	_, port, err := net.SplitHostPort(r.Addr)
	require.NoError(t, err)
	a := startService(t, serviceOptions{postgres: pg, redisURL: "redis://127.0.0.1:" + port})
	a.putKey(t, "k1", "default", 1, nil)
	code, _, g := a.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusOK, code, "%v", g)
	id := redisStoreID(t, r)
	require.NotEmpty(t, id)
	require.Equal(t, id, a.catalogKey(t, "k1").SyncedStore)

	b := startService(t, serviceOptions{postgres: pg, redisURL: "redis://localhost:" + port})
	require.Equal(t, id, b.catalogKey(t, "k1").SyncedStore, "b's start synced the key: still the same store")
	code, h, out := b.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusTooManyRequests, code, "a's lease holds the one slot: %v", out)
	require.True(t, b.catalogKey(t, "k1").QuarantineUntil.IsZero(), "full, not held back")
	require.NotEqual(t, "3600", h.Get("Retry-After"))

	code, _, out = a.internal(t, "report", withField(leaseBody(g), "outcome", "success"))
	require.Equal(t, http.StatusOK, code, "%v", out)
	code, _, g = b.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusOK, code, "%v", g)
	b.putKey(t, "k2", "default", 1, nil)
	code, _, out = a.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusOK, code, "%v", out)
	require.Equal(t, "k2", out["key_id"])
	for _, k := range []string{"k1", "k2"} {
		got := a.catalogKey(t, k)
		require.Equal(t, id, got.SyncedStore, k)
		require.True(t, got.QuarantineUntil.IsZero(), k)
	}
	for _, s := range []*service{a, b} {
		logs := s.logs.String()
		require.False(t, strings.Contains(logs, "another lease store") || strings.Contains(logs, "lost this key"), "nothing held back")
	}
}

// A Redis that loses its data while instances run (FLUSHALL here) loses
// its id too; an instance started then writes a new one before the
// running ones noticed. The keys the store lost are held back once, for
// --max-lease; then every instance adopts the id the store holds, and
// every allocate succeeds again, with no key held back again: no endless
// holds from instances that each call the store by another id.
func TestHTTPFlushedRedisConvergesOnOneID(t *testing.T) {
	pg := pgtest.URL(t)
	r := redistest.Start(t)
	_, port, err := net.SplitHostPort(r.Addr)
	require.NoError(t, err)
	start := func(host string) *service {
		return startService(t, serviceOptions{postgres: pg, redisURL: "redis://" + host + ":" + port, maxLease: time.Second})
	}
	a, b := start("127.0.0.1"), start("localhost")
	a.putKey(t, "k1", "default", 1, nil)
	a.putKey(t, "k2", "default", 1, nil)
	code, _, out := a.internal(t, "allocate-key", shortLease())
	require.Equal(t, http.StatusOK, code, "%v", out)
	before := redisStoreID(t, r)

	require.NoError(t, r.Client(t).FlushAll(t.Context()).Err())
	c := start("127.0.0.1")
	after := redisStoreID(t, r)
	require.NotEmpty(t, after)
	require.NotEqual(t, before, after, "c found no id: it wrote its own")

	services := []*service{a, b, c}
	// round asks each instance for a lease and gives it back, and says
	// whether all three were granted.
	round := func() bool {
		all := true
		for _, s := range services {
			code, _, g := s.internal(t, "allocate-key", shortLease())
			switch code {
			case http.StatusOK:
				code, _, out := s.internal(t, "report", withField(leaseBody(g), "outcome", "success"))
				require.Equal(t, http.StatusOK, code, "%v", out)
			case http.StatusTooManyRequests:
				all = false
			default:
				t.Fatalf("allocate: %d %v", code, g)
			}
		}
		return all
	}
	require.Eventually(t, round, 5*time.Second, 50*time.Millisecond, "the lost keys' hold ends, once")
	lost := func() (total float64) {
		for _, s := range services {
			n, _ := s.metric(t, "credpool_store_lost_keys_total")
			total += n
		}
		return total
	}
	found := lost()
	for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		require.True(t, round(), "every instance grants: no key held back again")
	}
	require.Equal(t, found, lost(), "no loss found again")
	require.Equal(t, after, redisStoreID(t, r), "the id c wrote stands")
	for _, k := range []string{"k1", "k2"} {
		require.Equal(t, after, a.catalogKey(t, k).SyncedStore, k)
	}
	require.True(t, strings.Contains(a.logs.String(), "adopted"), "a took the store's new id")
}

// After an upgrade from a release that named a Redis store by its URL,
// a key the catalog marks with the URL of the Redis the instance uses is
// this store's: not held back, and marked with the store's id from then
// on. A key marked with another spelling of the same address was another
// store's to that release, and is held back once. Likewise, a key marked
// "sqlite" is the SQLite store's in the catalog's own file.
func TestHTTPUpgradeFromURLNamedStores(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		r := redistest.Start(t)
		_, port, err := net.SplitHostPort(r.Addr)
		require.NoError(t, err)
		url := "redis://127.0.0.1:" + port
		a := startService(t, serviceOptions{redisURL: url})
		a.putKey(t, "k1", "default", 1, nil)
		a.putKey(t, "k2", "default", 1, nil)
		// The catalog and the store as that release left them: keys
		// marked with URLs, no id in the store.
		now := time.Now()
		require.NoError(t, a.cat.MarkSynced(t.Context(), fmt.Sprintf("redis redis://127.0.0.1:%s/0", port), now, "k1"))
		require.NoError(t, a.cat.MarkSynced(t.Context(), fmt.Sprintf("redis redis://localhost:%s/0", port), now, "k2"))
		require.NoError(t, r.Client(t).Del(t.Context(), clusterKeys.StoreID()).Err())
		a.app.Close(t.Context())

		b := startService(t, serviceOptions{redisURL: url, dir: a.dir})
		id := redisStoreID(t, r)
		require.NotEmpty(t, id)
		k1, k2 := b.catalogKey(t, "k1"), b.catalogKey(t, "k2")
		require.Equal(t, id, k1.SyncedStore)
		require.True(t, k1.QuarantineUntil.IsZero(), "the same URL: this store")
		require.Equal(t, id, k2.SyncedStore)
		require.False(t, k2.QuarantineUntil.IsZero(), "another spelling was another store")
		code, _, out := b.internal(t, "allocate-key", allocBody("default"))
		require.Equal(t, http.StatusOK, code, "%v", out)
		require.Equal(t, "k1", out["key_id"])
	})
	t.Run("sqlite", func(t *testing.T) {
		a := startService(t, serviceOptions{sqlite: true})
		a.putKey(t, "k1", "default", 1, nil)
		require.NoError(t, a.cat.MarkSynced(t.Context(), "sqlite", time.Now(), "k1"))
		_, err := a.db.ExecContext(t.Context(), `DELETE FROM lease_meta`)
		require.NoError(t, err)
		a.app.Close(t.Context())

		b := startService(t, serviceOptions{sqlite: true, dir: a.dir})
		k1 := b.catalogKey(t, "k1")
		require.NotEqual(t, "sqlite", k1.SyncedStore)
		require.NotEmpty(t, k1.SyncedStore)
		require.True(t, k1.QuarantineUntil.IsZero())
		code, _, out := b.internal(t, "allocate-key", allocBody("default"))
		require.Equal(t, http.StatusOK, code, "%v", out)
	})
}

// A move back to a store that still holds a key, while the store moved
// to may have a lease on it out: Redis, then the SQLite store of the same
// catalog (which holds the key back, and is told by an operator that no
// lease is out), then the same Redis again, which still has the key with
// a free slot. The SQLite store's lease may be in use, so the key is held
// back again rather than granted twice.
func TestHTTPBackToAnEarlierStoreHoldsKeysBack(t *testing.T) {
	r := redistest.Start(t)
	a := startService(t, serviceOptions{redis: r})
	a.putKey(t, "k1", "default", 1, nil)
	code, _, g := a.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusOK, code, "%v", g)
	code, _, out := a.internal(t, "report", withField(leaseBody(g), "outcome", "success"))
	require.Equal(t, http.StatusOK, code, "%v", out)
	a.app.Close(t.Context())

	b := startService(t, serviceOptions{sqlite: true, dir: a.dir})
	code, out = b.admin(t, http.MethodPost, "keys/k1/clear-leases", nil)
	require.Equal(t, http.StatusOK, code, "%v", out)
	code, _, out = b.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusOK, code, "the SQLite store grants the key: %v", out)
	b.app.Close(t.Context())

	c := startService(t, serviceOptions{redis: r, dir: a.dir})
	code, h, out := c.internal(t, "allocate-key", allocBody("default"))
	require.Equal(t, http.StatusTooManyRequests, code, "the SQLite store's lease may be in use: %v", out)
	require.NotEqual(t, "1", h.Get("Retry-After"), "held back until the longest lease ends")
	require.True(t, strings.Contains(c.logs.String(), "served by another lease store"), "the log says why")
}
