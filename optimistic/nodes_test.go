package optimistic

import (
	"errors"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	rs "github.com/credpool/credpool/internal/redisschema"
	"github.com/credpool/credpool/test/redistest"
)

// A server that answers but takes no writes (maxmemory reached here) is
// down for grants: Nodes says so and why, while Ping passes. The check
// leaves one probe key, which expires.
func TestNodesSeeRefusedWrites(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := t.Context()
	s, err := New(redis.NewClient(&redis.Options{Addr: srv.Addr}), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.rdb.Close() })

	nodes := s.Nodes(ctx)
	require.Len(t, nodes, 1)
	require.Equal(t, srv.Addr, nodes[0].Addr)
	require.NoError(t, nodes[0].Err)
	ttl, err := admin.PTTL(ctx, rs.Schema{Prefix: rs.DefaultPrefix}.Probe("0")).Result()
	require.NoError(t, err)
	require.Positive(t, ttl, "the probe key expires")

	require.NoError(t, admin.ConfigSet(ctx, "maxmemory", "1").Err())
	require.NoError(t, s.Ping(ctx), "it answers")
	require.ErrorContains(t, s.Nodes(ctx)[0].Err, "refuses writes: OOM")
	require.NoError(t, admin.ConfigSet(ctx, "maxmemory", "0").Err())
	require.NoError(t, s.Nodes(ctx)[0].Err)
}

// Every cluster slot has a probe tag, and Redis puts each tag's key on
// the slot the table says.
func TestSlotTagsAgreeWithRedis(t *testing.T) {
	srv := redistest.StartCluster(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := t.Context()
	tags := slotTags()
	cmds := make([]*redis.IntCmd, len(tags))
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for slot, tag := range tags {
			require.NotEmpty(t, tag, "slot %d", slot)
			cmds[slot] = p.ClusterKeySlot(ctx, rs.Schema{Prefix: rs.DefaultPrefix}.Probe(tag))
		}
		return nil
	})
	require.NoError(t, err)
	for slot, c := range cmds {
		require.Equal(t, int64(slot), c.Val(), "tag %q", tags[slot])
	}
}

// reply is an error reply as a Redis server would send it.
type reply string

func (r reply) Error() string { return string(r) }
func (reply) RedisError()     {}

func TestRefusesWrites(t *testing.T) {
	discarded := reply("EXECABORT Transaction discarded because of previous errors.")
	for _, c := range []struct {
		err  error
		want bool
	}{
		{reply("READONLY You can't write against a read only replica."), true},
		{reply("NOREPLICAS Not enough good replicas to write."), true},
		{reply("OOM command not allowed when used memory > 'maxmemory'."), true},
		{reply("MISCONF Errors writing to the AOF file: No space left on device"), true},
		{reply("EXECABORT Transaction discarded because of: NOREPLICAS Not enough good replicas to write."), true},
		{fmt.Errorf("%w (queued: %w)", discarded, reply("OOM command not allowed")), true},
		{fmt.Errorf("optimistic: allocate: %w", fmt.Errorf("%w (queued: %w)", discarded, reply("READONLY x"))), true},
		{discarded, false},
		{reply("ERR wrong number of arguments for 'set' command"), false},
		{errors.New("READONLY, but not a reply"), false},
		{nil, false},
	} {
		require.Equal(t, c.want, refusesWrites(c.err), "%v", c.err)
	}
}
