package bench_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/bench"
)

// RunService refuses what credpool serve would refuse, or what makes no
// sense, before it starts anything: the SQLite lease store on a
// PostgreSQL catalog, an unknown catalog, bad instance counts. The short
// runs against real processes are in cmd/credpool, whose test binary can
// stand in for credpool serve.
func TestRunServiceRefuses(t *testing.T) {
	both, err := bench.Select(bench.ServiceStrategies(), "sqlite,optimistic")
	require.NoError(t, err)
	base := bench.ServiceConfig{
		Strategies: both, Keys: 3, Limits: []int{2}, Workers: []int{4}, Duration: time.Second, Reps: 2,
		TTL: 10 * time.Second, Serve: []string{"/nonexistent/credpool", "serve"},
	}
	require.NoError(t, base.Validate(), "empty Catalog and Instances: one instance on SQLite")
	require.Equal(t, 2*2*2, base.Runs())
	for _, tc := range []struct {
		catalog   string
		instances []int
		want      string
	}{
		{bench.CatalogPostgres, nil, "the sqlite lease store lives in a SQLite catalog's file, so credpool serve refuses it"},
		{"mysql", nil, `unknown catalog "mysql"`},
		{"", []int{1, 0}, "instances must be at least 1"},
		{"", []int{3, 1, 3}, "3 instances listed twice"},
	} {
		cfg := base
		cfg.Catalog, cfg.Instances = tc.catalog, tc.instances
		_, err := bench.RunService(context.Background(), cfg)
		require.ErrorContains(t, err, tc.want, "%q %v", tc.catalog, tc.instances)
	}

	cfg := base
	cfg.Strategies, cfg.Catalog, cfg.Instances = both[1:], bench.CatalogPostgres, []int{1, 3}
	require.NoError(t, cfg.Validate())
	require.Equal(t, 2*(2+1), cfg.Runs(), "per repetition: the service at 1 and at 3 instances, and the store")
}
