package redisproc

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Three masters with a replica each split the slots and agree; a master
// killed with SIGKILL is replaced by its own replica, and the cluster is
// whole again.
func TestRunClusterFailsOver(t *testing.T) {
	c, err := RunCluster(t.TempDir(), 3, 1)
	require.NoError(t, err)
	t.Cleanup(c.Stop)
	require.Len(t, c.Nodes, 6)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	masters := map[string]bool{}
	for _, key := range []string{"{a}", "{b}", "{c}", "{d}", "{e}", "{f}"} {
		require.NoError(t, rdb.Set(ctx, key, "v", 0).Err())
		m, replicas, err := c.MasterOf(ctx, key)
		require.NoError(t, err)
		require.Len(t, replicas, 1)
		masters[m.Addr] = true
	}
	require.Len(t, masters, 3, "the keys spread over every master")

	old, replicas, err := c.MasterOf(ctx, "{a}")
	require.NoError(t, err)
	c.Kill(old)
	killed := time.Now()
	promoted, err := c.WaitPromoted(ctx, "{a}", old)
	require.NoError(t, err)
	require.Equal(t, replicas[0], promoted, "the dead master's own replica takes over")
	t.Logf("replica promoted %v after the kill", time.Since(killed).Round(time.Millisecond))
	require.NoError(t, c.WaitHealthy(ctx))
	m, _, err := c.MasterOf(ctx, "{a}")
	require.NoError(t, err)
	require.Equal(t, promoted, m)
	// go-redis learns of the new master when it next reloads its slot map.
	rdb.ReloadState(ctx)
	require.Eventually(t, func() bool {
		return rdb.Get(ctx, "{a}").Val() == "v"
	}, 10*time.Second, 50*time.Millisecond, "the replica had the key")
}

// A cluster needs a master; zero is refused before anything starts.
func TestRunClusterRefusesNoMasters(t *testing.T) {
	_, err := RunCluster(t.TempDir(), 0, 1)
	require.ErrorContains(t, err, "at least one master")
}
