package requestlog_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	rs "github.com/credpool/credpool/internal/redisschema"
	"github.com/credpool/credpool/internal/requestlog"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/internal/sqlitex/sqlitextest"
	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/test/redistest"
)

// log is what both implementations offer.
type log interface {
	Claim(ctx context.Context, id, token, fingerprint string, ttl time.Duration) (requestlog.Entry, bool, error)
	Record(ctx context.Context, id, token string, l optimistic.Lease) error
	Forget(ctx context.Context, id, token string) error
	Extend(ctx context.Context, leaseID string, until time.Time) error
}

var (
	_ log = (*requestlog.Redis)(nil)
	_ log = (*requestlog.SQLite)(nil)
)

func openSQLite(t *testing.T) (*requestlog.SQLite, *sqlitex.DB) {
	t.Helper()
	db := sqlitextest.Temp(t)
	l, err := requestlog.NewSQLite(t.Context(), db)
	require.NoError(t, err)
	return l, db
}

func newRedis(t *testing.T, rdb redis.UniversalClient) *requestlog.Redis {
	t.Helper()
	l, err := requestlog.NewRedis(rdb, rs.DefaultPrefix)
	require.NoError(t, err)
	return l
}

// each runs fn against a log in Redis and one in SQLite.
func each(t *testing.T, fn func(t *testing.T, l log)) {
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		fn(t, newRedis(t, redistest.Start(t).Client(t)))
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		l, _ := openSQLite(t)
		fn(t, l)
	})
}

func lease(id string, ttl time.Duration) optimistic.Lease {
	return optimistic.Lease{
		LeaseRef: optimistic.LeaseRef{Provider: "openai", Pool: "default", KeyID: "k", LeaseID: id},
		Until:    time.Now().Add(ttl).Truncate(time.Millisecond),
		Fence:    7,
	}
}

func TestClaimRecordForget(t *testing.T) {
	each(t, func(t *testing.T, l log) {
		ctx := t.Context()
		_, claimed, err := l.Claim(ctx, "r1", "tok-a", "default|m", time.Minute)
		require.NoError(t, err)
		require.True(t, claimed)

		_, claimed, err = l.Claim(ctx, "r1", "tok-a", "default|m", time.Minute)
		require.NoError(t, err)
		require.True(t, claimed, "a re-sent claim finds its own token")
		_, _, err = l.Claim(ctx, "r1", "tok-b", "default|m", time.Minute)
		require.ErrorIs(t, err, requestlog.ErrInFlight)
		_, _, err = l.Claim(ctx, "r1", "tok-b", "vip|m", time.Minute)
		require.ErrorIs(t, err, requestlog.ErrReused)

		require.ErrorIs(t, l.Record(ctx, "r1", "tok-b", lease("l1", time.Minute)), requestlog.ErrClaimLost, "only the holder records")
		want := lease("l1", time.Minute)
		require.NoError(t, l.Record(ctx, "r1", "tok-a", want))
		e, claimed, err := l.Claim(ctx, "r1", "tok-b", "default|m", time.Minute)
		require.NoError(t, err)
		require.False(t, claimed)
		require.Equal(t, "tok-a", e.Token)
		require.Equal(t, want.LeaseRef, e.Lease.LeaseRef)
		require.True(t, want.Until.Equal(e.Lease.Until))
		require.Equal(t, want.Fence, e.Lease.Fence)
		_, _, err = l.Claim(ctx, "r1", "tok-c", "vip|m", time.Minute)
		require.ErrorIs(t, err, requestlog.ErrReused, "a recorded id with other parameters")

		require.NoError(t, l.Forget(ctx, "r1", "tok-b"), "not the holder: a no-op")
		_, _, err = l.Claim(ctx, "r1", "tok-b", "default|m", time.Minute)
		require.NoError(t, err)
		require.NoError(t, l.Forget(ctx, "r1", "tok-a"))
		_, claimed, err = l.Claim(ctx, "r1", "tok-b", "vip|m", time.Minute)
		require.NoError(t, err)
		require.True(t, claimed, "forgotten: free for anyone")
	})
}

// A claim that outlived its window is gone: its holder's Record changes
// nothing, before anyone else claimed the id (on SQLite its dead row is
// still there) and after the id went to the next caller.
func TestExpiredClaimIsLost(t *testing.T) {
	each(t, func(t *testing.T, l log) {
		ctx := t.Context()
		_, _, err := l.Claim(ctx, "r1", "tok-a", "f", time.Millisecond)
		require.NoError(t, err)
		time.Sleep(1100 * time.Millisecond) // claims last at least a second
		require.ErrorIs(t, l.Record(ctx, "r1", "tok-a", lease("l0", time.Minute)), requestlog.ErrClaimLost, "expired, not reclaimed")
		_, claimed, err := l.Claim(ctx, "r1", "tok-b", "f", time.Minute)
		require.NoError(t, err)
		require.True(t, claimed)
		require.ErrorIs(t, l.Record(ctx, "r1", "tok-a", lease("l1", time.Minute)), requestlog.ErrClaimLost)
		require.NoError(t, l.Record(ctx, "r1", "tok-b", lease("l2", time.Minute)))
	})
}

// A record lives as long as its lease, and a renewal (Extend) keeps it.
func TestRecordLivesWithItsLease(t *testing.T) {
	each(t, func(t *testing.T, l log) {
		ctx := t.Context()
		for _, id := range []string{"short", "renewed"} {
			_, _, err := l.Claim(ctx, id, "tok", "f", time.Minute)
			require.NoError(t, err)
			require.NoError(t, l.Record(ctx, id, "tok", lease("lease-"+id, time.Second)))
		}
		require.NoError(t, l.Extend(ctx, "lease-renewed", time.Now().Add(time.Hour)))
		require.NoError(t, l.Extend(ctx, "lease-of-no-request", time.Now().Add(time.Hour)))
		time.Sleep(1200 * time.Millisecond)

		_, claimed, err := l.Claim(ctx, "short", "other", "f", time.Minute)
		require.NoError(t, err)
		require.True(t, claimed, "the record ended with its lease")
		e, claimed, err := l.Claim(ctx, "renewed", "other", "f", time.Minute)
		require.NoError(t, err)
		require.False(t, claimed, "the renewed lease still answers its id")
		require.Equal(t, "lease-renewed", e.Lease.LeaseID)
	})
}

// A claim whose reply is lost is re-sent by go-redis and must find its own
// token, not answer "in flight" to its own caller.
func TestLostClaimReplyIsOwnClaim(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	l := newRedis(t, rdb)
	proxy.CutNextReply("set")
	_, claimed, err := l.Claim(t.Context(), "r1", "tok-a", "f", time.Minute)
	require.NoError(t, err)
	require.True(t, claimed)
	require.Equal(t, 1, proxy.Cuts(), "the first reply was lost")
}

// withDeadRows returns a log on a fresh file holding n claims, dead-0 to
// dead-<n-1>, that have expired and are not pruned yet.
func withDeadRows(t *testing.T, n int) (*requestlog.SQLite, *sqlitex.DB) {
	t.Helper()
	l, db := openSQLite(t)
	for i := range n {
		_, _, err := l.Claim(t.Context(), fmt.Sprint("dead-", i), "tok", "f", time.Millisecond)
		require.NoError(t, err)
	}
	time.Sleep(1100 * time.Millisecond) // claims last at least a second
	return l, db
}

// A dead row not pruned yet answers nothing: an expired claim is free,
// whatever its parameters, however many dead rows wait.
func TestSQLiteDeadRowsDoNotAnswer(t *testing.T) {
	t.Parallel()
	l, _ := withDeadRows(t, 100)
	for i := range 100 {
		_, claimed, err := l.Claim(t.Context(), fmt.Sprint("dead-", 99-i), "other", "other-f", time.Minute)
		require.NoError(t, err, "dead-%d", 99-i)
		require.True(t, claimed)
	}
}

// Dead rows do not pile up: every claim prunes a batch.
func TestSQLitePrunesDeadRows(t *testing.T) {
	t.Parallel()
	l, db := withDeadRows(t, 200)
	for i := range 10 {
		_, _, err := l.Claim(t.Context(), fmt.Sprint("live-", i), "tok", "f", time.Minute)
		require.NoError(t, err)
	}
	var rows int
	require.NoError(t, db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM request_log`).Scan(&rows))
	require.Equal(t, 10, rows, "200 dead rows pruned by 10 claims")
}

// The log in Redis lives under the store's prefix, "credpool" unless set:
// a prefix that would break the key names' hash tags is refused.
func TestRedisPrefix(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	for prefix, want := range map[string]string{"": rs.DefaultPrefix, "tenant-a": "tenant-a"} {
		l, err := requestlog.NewRedis(rdb, prefix)
		require.NoError(t, err)
		_, _, err = l.Claim(t.Context(), "r-"+want, "tok", "f", time.Minute)
		require.NoError(t, err)
		require.NoError(t, l.Record(t.Context(), "r-"+want, "tok", lease("l-"+want, time.Minute)))
		keys := rs.Schema{Prefix: want}
		n, err := rdb.Exists(t.Context(), keys.Request("r-"+want), keys.RequestByLease("l-"+want)).Result()
		require.NoError(t, err)
		require.Equal(t, int64(2), n, "prefix %q", prefix)
	}
	for _, bad := range []string{"{credpool}", "a{b", "b}"} {
		_, err := requestlog.NewRedis(rdb, bad)
		require.ErrorIs(t, err, optimistic.ErrInvalid, bad)
	}
}
