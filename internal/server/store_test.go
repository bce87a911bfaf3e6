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

// A Sentinel URL names the master, its database, the sentinels (port 26379
// by default, IPv6 in brackets) and two sets of credentials: the master's
// in the user info, the sentinels' in options.
func TestSentinelURL(t *testing.T) {
	tests := []struct {
		raw       string
		want      redis.FailoverOptions
		tls       bool
		readLimit time.Duration
	}{
		{raw: "redis+sentinel://h1/mymaster", want: redis.FailoverOptions{
			MasterName: "mymaster", SentinelAddrs: []string{"h1:26379"}}},
		{raw: "redis+sentinel://u:p%40ss@h1:5000,h2,[::1]:5001,[::2]/m/3?read_timeout=4s", readLimit: 4 * time.Second,
			want: redis.FailoverOptions{MasterName: "m", DB: 3, Username: "u", Password: "p@ss",
				SentinelAddrs: []string{"h1:5000", "h2:26379", "[::1]:5001", "[::2]:26379"}}},
		{raw: "REDISS+SENTINEL://:pw@h1:5000/m/?sentinel_username=su&sentinel_password=sp", tls: true,
			want: redis.FailoverOptions{MasterName: "m", Password: "pw", SentinelUsername: "su", SentinelPassword: "sp",
				SentinelAddrs: []string{"h1:5000"}}},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			require.True(t, isSentinelURL(tt.raw))
			rdb, _, err := redisClient(tt.raw, false)
			require.NoError(t, err)
			defer rdb.Close()
			o, err := parseSentinelURL(tt.raw)
			require.NoError(t, err)
			require.Equal(t, tt.want.MasterName, o.MasterName)
			require.Equal(t, tt.want.SentinelAddrs, o.SentinelAddrs)
			require.Equal(t, tt.want.DB, o.DB)
			require.Equal(t, tt.want.Username, o.Username)
			require.Equal(t, tt.want.Password, o.Password)
			require.Equal(t, tt.want.SentinelUsername, o.SentinelUsername)
			require.Equal(t, tt.want.SentinelPassword, o.SentinelPassword)
			require.Equal(t, tt.tls, o.TLSConfig != nil)
			if tt.tls {
				require.Empty(t, o.TLSConfig.ServerName, "each connection checks the host it dials")
			}
			require.Equal(t, tt.readLimit, o.ReadTimeout)
		})
	}
	require.False(t, isSentinelURL("redis://h:6379/0"))
}

// A bad Sentinel URL says what is wrong and never quotes its password.
func TestSentinelURLErrors(t *testing.T) {
	for raw, why := range map[string]string{
		"redis+sentinel://u:s3cret@h1:26379":                          "no master name",
		"redis+sentinel://u:s3cret@h1:26379/":                         "no master name",
		"redis+sentinel://u:s3cret@h1:26379/m/x":                      "database",
		"redis+sentinel://u:s3cret@h1:26379/m/0/1":                    "the path is /master[/db]",
		"redis+sentinel://u:s3cret@h1:26379,/m":                       "sentinel address 2",
		"redis+sentinel://u:s3cret@h1:99999/m":                        "sentinel address 1",
		"redis+sentinel://u:s3cret@/m":                                "sentinel address 1",
		"redis+sentinel://u:s3/cret@h1/m":                             "percent-encode",
		"redis+sentinel://u:s3cret@h1/m?password=s3cret":              "option password",
		"redis+sentinel://u:s3cret@h1/m?replica_only=true":            "option replica_only",
		"redis+sentinel://u:s3cret@h1/m?route_randomly=true":          "option route_randomly",
		"redis+sentinel://u:s3cret@h1/m?no_such_option=1":             "no_such_option",
		"redis+sentinel://u:s3cret@h1/m?read_timeout=soon":            "read_timeout",
		"redis+sentinel://u:s3cret@h1/m#frag":                         "do not parse",
		"redis+sentinel://u:s3cret%zz@h1/m":                           "password does not unescape",
		"redis+sentinel://h1/m?sentinel_password=s3cret&read_timeout": "",
	} {
		t.Run(raw, func(t *testing.T) {
			_, _, err := redisClient(raw, false)
			if why == "" {
				require.NoError(t, err, "an empty option is go-redis's default")
				return
			}
			require.ErrorIs(t, err, errBadSentinelURL)
			require.ErrorContains(t, err, why)
			require.NotContains(t, err.Error(), "s3cret")
		})
	}
	_, _, err := redisClient("redis+sentinel://u:s3cret@h1/m", true)
	require.ErrorIs(t, err, errSentinelCluster)
	require.NotContains(t, err.Error(), "s3cret")
}

// A Sentinel-watched store is its master's name, database and sentinels,
// however they are written; not the credentials, not the master's address.
func TestSentinelIdentity(t *testing.T) {
	a := storeID(t, "redis+sentinel://h1:26379,h2:26380/m", false)
	for _, raw := range []string{
		"redis+sentinel://H2:26380,h1/m/0",
		"redis+sentinel://u:pw@h1,h2:26380,h1:26379/m?sentinel_password=x&read_timeout=3s",
		"rediss+sentinel://h2:26380,h1:26379/m",
	} {
		require.Equal(t, a, storeID(t, raw, false), raw)
	}
	for _, raw := range []string{
		"redis+sentinel://h1:26379,h2:26380/other",
		"redis+sentinel://h1:26379,h2:26380/m/1",
		"redis+sentinel://h1:26379/m",
		"redis://h1:26379/0",
	} {
		require.NotEqual(t, a, storeID(t, raw, false), raw)
	}
	require.NotContains(t, storeID(t, "redis+sentinel://u:s3cret@h1/m?sentinel_password=s3cret", false), "s3cret")
}

// The Sentinel client gets the same bounds as the others.
func TestSentinelClientBounds(t *testing.T) {
	o, err := parseSentinelURL("redis+sentinel://h1/m")
	require.NoError(t, err)
	require.Zero(t, o.ReadTimeout, "go-redis's default until sentinelClient bounds it")
	rdb, _, err := redisClient("redis+sentinel://h1/m?dialer_retries=3", false)
	require.NoError(t, err)
	defer rdb.Close()
	co := rdb.(*redis.Client).Options()
	require.Equal(t, redisTimeout, co.DialTimeout)
	require.Equal(t, redisTimeout, co.ReadTimeout)
	require.Equal(t, redisTimeout, co.WriteTimeout)
	require.Equal(t, redisPoolTimeout, co.PoolTimeout)
	require.Equal(t, redisRetries, co.MaxRetries)
	require.Equal(t, 3, co.DialerRetries)
	require.True(t, co.ContextTimeoutEnabled)
}
