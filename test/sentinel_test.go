package test

import (
	"bytes"
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/server"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/test/redistest"
)

// The service on a redis+sentinel:// URL grants through the master the
// sentinels name. After a kill -9 of that master and the sentinels'
// promotion of a replica, grants resume by themselves, and no key ever has
// more holders than its limit, nor a fencing token twice.
//
// Two replicas and MinReplicas 1: a grant is on a replica before it is
// answered, and Sentinel promotes the replica with the most data, so the
// failover loses no grant (with no acknowledgements it may, as
// TestHTTPFailoverWithoutAcksHoldsTheKeyBack shows).
func TestHTTPSentinelFailover(t *testing.T) {
	const limit = 60 * time.Second
	sn := redistest.StartSentinels(t, 2)
	s := startService(t, serviceOptions{redisURL: sn.URL(), minReplicas: 1, maxLease: 10 * time.Second})
	up, ok := s.metric(t, `credpool_store_node_up{node=""}`)
	require.True(t, ok, "the master behind Sentinel moves: it is named by no address")
	require.Equal(t, 1.0, up, "it took the check's write, acknowledged by a replica")
	// The probe's own pool: it never takes a slot from the audited callers.
	s.putKey(t, "probe", "probe", 1, nil)
	var killed, promoted, resumed time.Time
	marks := audited(t, s, map[string]int{"k1": 1, "k2": 2, "k3": 3}, 2, func(mark func()) {
		time.Sleep(time.Second)
		mark()
		old := sn.Master.Addr
		sn.Master.Stop()
		killed = time.Now()
		addr := sn.WaitFailover(t, old, limit)
		promoted = time.Now()
		require.Contains(t, []string{sn.Replicas[0].Addr, sn.Replicas[1].Addr}, addr, "a replica is promoted")
		waitFor(t, "granted again after the failover", limit-time.Since(killed), func() bool {
			code, _, g := s.internal(t, "allocate-key", withField(allocBody("probe"), "lease_seconds", 2))
			if code != http.StatusOK {
				return false
			}
			resumed = time.Now()
			code, _, out := s.internal(t, "release", leaseBody(g))
			require.Equal(t, http.StatusOK, code, "%v", out)
			return true
		})
		mark()
		// Longer than a lease: keys held by "crashed" callers come back.
		time.Sleep(3 * time.Second)
	})
	require.Positive(t, marks[0], "grants before the kill")
	require.Greater(t, marks[2], marks[1], "the callers' grants resume after the failover")
	t.Logf("kill -9 of the master: promoted after %s, granting again after %s (%s after the promotion)",
		promoted.Sub(killed).Round(time.Millisecond), resumed.Sub(killed).Round(time.Millisecond),
		resumed.Sub(promoted).Round(time.Millisecond))
}

// A Sentinel URL the service cannot use is a clear error at start that
// never quotes a password: malformed, sentinels that do not answer, a
// master they do not know, credentials the master refuses.
func TestServeSentinelURLErrors(t *testing.T) {
	sn := redistest.StartSentinels(t, 0)
	addrs := strings.TrimPrefix(strings.TrimSuffix(sn.URL(), "/"+redistest.SentinelMaster), "redis+sentinel://")
	for raw, want := range map[string]string{
		"redis+sentinel://u:s3cret@" + addrs:                                  "no master name",
		"redis+sentinel://u:s3cret@127.0.0.1:1/" + redistest.SentinelMaster:   "not reachable",
		"redis+sentinel://u:s3cret@" + addrs + "/no-such-master":              "watch no master of that name",
		"redis+sentinel://u:s3cret@" + addrs + "/" + redistest.SentinelMaster: "WRONGPASS",
	} {
		t.Run(raw, func(t *testing.T) {
			err := newServer(t, raw)
			require.ErrorContains(t, err, want)
			require.NotContains(t, err.Error(), "s3cret")
		})
	}
	require.NoError(t, newServer(t, sn.URL()), "the same sentinels with the right name and no credentials")
}

// newServer builds the service on the lease store at redisURL, as serve
// does, and closes it at once.
func newServer(t *testing.T, redisURL string) error {
	t.Helper()
	db, err := sqlitex.Open(filepath.Join(t.TempDir(), "credpool.db"))
	require.NoError(t, err)
	defer db.Close()
	sealer, err := catalog.NewSealer(bytes.Repeat([]byte{7}, 32))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	app, err := server.New(ctx, server.Config{
		DB: db, Sealer: sealer, InternalKey: internalKey, AdminKey: adminKey, RedisURL: redisURL,
	})
	if err == nil {
		app.Close(context.Background())
	}
	return err
}
