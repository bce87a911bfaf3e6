package test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/redisschema"
	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/optimistic/leasetest"
	"github.com/credpool/credpool/test/redistest"
)

// redisBackend wraps any store built on a fresh redis-server for the suite.
func redisBackend(t *testing.T, cluster bool, newStore func(t *testing.T, rdb redis.UniversalClient) optimistic.LeaseStore) leasetest.Backend {
	start := redistest.Start
	if cluster {
		start = redistest.StartCluster
	}
	srv := start(t)
	rdb := srv.Client(t)
	return leasetest.Backend{
		Store: newStore(t, rdb),
		SetField: func(t *testing.T, keyID, field string, value *string) {
			t.Helper()
			name := redisschema.Schema{Prefix: "credpool"}.Key(keyID)
			var err error
			if value == nil {
				err = rdb.HDel(context.Background(), name, field).Err()
			} else {
				err = rdb.HSet(context.Background(), name, field, *value).Err()
			}
			require.NoError(t, err)
		},
		Find: func(t *testing.T, s string) []string { return srv.Find(t, s) },
		Stop: func(*testing.T) { srv.Stop() },
	}
}

func newOptimistic(t *testing.T, rdb redis.UniversalClient) optimistic.LeaseStore {
	s, err := optimistic.New(rdb, nil)
	require.NoError(t, err)
	return s
}

func TestOptimisticConformance(t *testing.T) {
	leasetest.Run(t, func(t *testing.T) leasetest.Backend { return redisBackend(t, false, newOptimistic) })
}

func TestOptimisticConformanceCluster(t *testing.T) {
	leasetest.Run(t, func(t *testing.T) leasetest.Backend { return redisBackend(t, true, newOptimistic) })
}

func TestOptimisticStress(t *testing.T) {
	leasetest.Stress(t, func(t *testing.T) leasetest.Backend { return redisBackend(t, false, newOptimistic) }, 3*time.Second)
}
