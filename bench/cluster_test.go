package bench_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/bench"
	"github.com/credpool/credpool/test/redistest"
)

// The harness runs against a Redis Cluster (one node owning every slot,
// so cluster rules apply: no command may cross slots), in one process and
// in two, and leaves nothing behind: its clean-up deletes key by key, node
// by node.
func TestRunOnCluster(t *testing.T) {
	srv := redistest.StartCluster(t)
	redis, err := bench.Select(bench.Strategies(), "optimistic,lua")
	require.NoError(t, err)
	cfg := config(redis, cells(t, grid([]string{"hot", "uniform"}, 4, 2, 1, 2)))
	cfg.RedisURL, cfg.RedisCluster = "redis://"+srv.Addr, true
	rep, err := bench.Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Len(t, rep.Runs, 8)
	for _, run := range rep.Runs {
		require.Positive(t, run.Counts.Grants, "%s %s procs=%d", run.Strategy, run.Scenario, run.Procs)
		require.Zero(t, run.Counts.Errors, "%s %s procs=%d: %s", run.Strategy, run.Scenario, run.Procs, run.FirstError)
		require.True(t, run.Audit.OK(), "%+v", run.Audit)
		require.NotNil(t, run.CommandsPerGrant)
		require.NotNil(t, run.RoundTripsPerGrant)
		require.Positive(t, *run.RoundTripsPerGrant, "the cluster's nodes count round trips")
		require.NotContains(t, run.Commands, "cluster|slots", "reading the slot map is no command of a grant")
	}
	require.Contains(t, rep.Env.RedisServer, "Redis Cluster at "+srv.Addr)
	require.Empty(t, srv.Find(t, "credpool-bench"), "the runs' keys are gone")
	n, err := srv.Client(t).DBSize(t.Context()).Result()
	require.NoError(t, err)
	require.Zero(t, n, "nothing at all is left behind")
}

// With no URL, -redis-cluster starts a one-node cluster of its own.
func TestRunOnOwnCluster(t *testing.T) {
	optimistic, err := bench.Select(bench.Strategies(), "optimistic")
	require.NoError(t, err)
	cfg := config(optimistic, cells(t, grid([]string{"hot"}, 2, 1, 1)))
	cfg.RedisCluster = true
	rep, err := bench.Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Len(t, rep.Runs, 1)
	require.Positive(t, rep.Runs[0].Counts.Grants)
	require.True(t, strings.HasPrefix(rep.Env.RedisServer, "one-node Redis Cluster started by the harness"), rep.Env.RedisServer)
}
