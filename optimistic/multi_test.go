package optimistic

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// An EXEC answer that is not one reply per queued command (a proxy or a
// server that does not follow the protocol) is an error of unknown
// outcome, not an index out of range later.
func TestUnexpectedExecReply(t *testing.T) {
	for _, val := range []any{"OK", []any{int64(1)}, []any{int64(1), int64(2), int64(3)}} {
		call := txCall{body: []cmd{{"incr", "a"}, {"incr", "b"}}}
		call.exec = redis.NewCmd(context.Background())
		call.exec.SetVal(val)
		replies, ran, err := call.result()
		require.ErrorContains(t, err, "unexpected EXEC reply", "%v", val)
		require.False(t, ran, "%v: the caller cannot know whether it ran", val)
		require.Nil(t, replies)
	}
	call := txCall{body: []cmd{{"incr", "a"}, {"incr", "b"}}}
	call.exec = redis.NewCmd(context.Background())
	call.exec.SetVal([]any{int64(1), int64(2)})
	replies, ran, err := call.result()
	require.NoError(t, err)
	require.True(t, ran)
	require.Equal(t, []any{int64(1), int64(2)}, replies)
}
