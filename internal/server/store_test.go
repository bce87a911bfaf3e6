package server

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// storeID is the identity redisClient gives the Redis at raw.
func storeID(t *testing.T, raw string, cluster bool) string {
	t.Helper()
	rdb, id, err := redisClient(raw, cluster)
	require.NoError(t, err, raw)
	require.NoError(t, rdb.Close())
	return id
}

// One Redis is one store however its URL is written; another database or
// server is another store.
func TestRedisIdentity(t *testing.T) {
	for _, same := range [][]string{
		{"redis://h:6379", "redis://h:6379/0", "redis://h", "redis://H:6379/0", "redis://user:pw@h:6379/0",
			"rediss://h:6379/0", "redis://h:6379/0?client_name=a&read_timeout=3s", "redis://h:6379?db=0"},
		{"redis://h:6379/2", "redis://:other@h:6379/2", "redis://h:6379?db=2"},
	} {
		for _, raw := range same[1:] {
			require.Equal(t, storeID(t, same[0], false), storeID(t, raw, false), raw)
		}
	}
	for _, other := range []string{"redis://h:6379/1", "redis://h:6380/0", "redis://g:6379/0"} {
		require.NotEqual(t, storeID(t, "redis://h:6379/0", false), storeID(t, other, false), other)
	}
	require.NotContains(t, storeID(t, "redis://user:s3cret@h:6379/0", false), "s3cret")

	a := storeID(t, "redis://a:7000?addr=b:7001&addr=c:7002", true)
	for _, raw := range []string{"redis://c:7002?addr=a:7000&addr=b:7001", "redis://u:pw@b:7001?addr=c:7002&addr=a:7000&client_name=x"} {
		require.Equal(t, a, storeID(t, raw, true), raw)
	}
	require.NotEqual(t, a, storeID(t, "redis://a:7000?addr=b:7001", true))
	require.NotEqual(t, a, storeID(t, "redis://a:7000", false))
}

// The client's timeouts bound a silent Redis unless the URL sets its own.
func TestRedisClientBounds(t *testing.T) {
	rdb, _, err := redisClient("redis://h:6379/0", false)
	require.NoError(t, err)
	defer rdb.Close()
	o := rdb.(*redis.Client).Options()
	require.Equal(t, redisTimeout, o.DialTimeout)
	require.Equal(t, redisTimeout, o.ReadTimeout)
	require.Equal(t, redisTimeout, o.WriteTimeout)
	require.Equal(t, redisPoolTimeout, o.PoolTimeout)
	require.Equal(t, redisRetries, o.MaxRetries)
	require.Equal(t, redisDialAttempts, o.DialerRetries)
	require.True(t, o.ContextTimeoutEnabled)

	rdb, _, err = redisClient("redis://h:6379/0?dial_timeout=3s&read_timeout=4s&max_retries=5&pool_timeout=6s", false)
	require.NoError(t, err)
	defer rdb.Close()
	o = rdb.(*redis.Client).Options()
	require.Equal(t, 3*time.Second, o.DialTimeout)
	require.Equal(t, 4*time.Second, o.ReadTimeout)
	require.Equal(t, 4*time.Second, o.WriteTimeout, "the write timeout follows the read timeout")
	require.Equal(t, 6*time.Second, o.PoolTimeout)
	require.Equal(t, 5, o.MaxRetries)

	cluster, _, err := redisClient("redis://a:7000?addr=b:7001&read_timeout=2s&dialer_retries=4", true)
	require.NoError(t, err)
	defer cluster.Close()
	co := cluster.(*redis.ClusterClient).Options()
	require.Equal(t, redisTimeout, co.DialTimeout)
	require.Equal(t, 2*time.Second, co.ReadTimeout)
	require.Equal(t, redisRetries, co.MaxRetries)
	require.Equal(t, 4, co.DialerRetries)
	require.True(t, co.ContextTimeoutEnabled)

	_, _, err = redisClient("redis://user:s3cret@h:6379/x", false)
	require.ErrorIs(t, err, errBadURL)
	require.NotContains(t, err.Error(), "s3cret")
}
