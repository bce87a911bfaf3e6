package optimistic

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestParseLimit(t *testing.T) {
	for raw, want := range map[string]int{"": 1, "abc": 1, "0": 1, "-3": 1, "2.5": 1, "1": 1, "7": 7, " 3": 1} {
		require.Equal(t, want, ParseLimit(raw), "%q", raw)
	}
}

func TestUsable(t *testing.T) {
	const now = 1_000
	for _, c := range []struct {
		status   Status
		cooldown string
		want     bool
	}{
		{StatusAvailable, "", true},
		{StatusAvailable, "5000", true},
		{StatusPending, "", false},
		{StatusDisabled, "", false},
		{StatusExhausted, "1", false},
		{StatusRateLimited, "", false},
		{StatusRateLimited, "soon", false},
		{StatusRateLimited, "999", true},
		{StatusRateLimited, "1000", true},
		{StatusRateLimited, "1001", false},
		{StatusCooldown, "999", true},
		{StatusCooldown, "1001", false},
		{"", "", false},
		{"AVAILABLE", "", false},
	} {
		require.Equal(t, c.want, Usable(c.status, c.cooldown, now), "%q cooldown %q", c.status, c.cooldown)
	}
}

func TestValidID(t *testing.T) {
	for _, id := range []string{"a", "0", "key_01HZX", "gpt-4o.2024", strings.Repeat("x", 128), "0f8fad5b-d9cb-469f-a165-70867728950e"} {
		require.True(t, ValidID(id), "%q", id)
	}
	for _, id := range []string{"", "-a", ".a", "_a", "a b", "a{b", "a}b", "a/b", "a:b", "é", strings.Repeat("x", 129)} {
		require.False(t, ValidID(id), "%q", id)
	}
}

func TestSplitLeases(t *testing.T) {
	zs := []redis.Z{{Score: 90, Member: "a"}, {Score: 100, Member: "b"}, {Score: 150, Member: "c"}, {Score: 200, Member: "d"}}
	s := splitLeases(zs, 100)
	require.Equal(t, []string{"a", "b"}, s.expired, "expiring exactly now counts as expired")
	require.Equal(t, 2, s.live)
	require.Equal(t, int64(150), s.first)
	require.Equal(t, leaseSet{}, splitLeases(nil, 100))
}

func TestFreeAt(t *testing.T) {
	const now = 1_000
	live := func(n int, first int64) leaseSet { return leaseSet{live: n, first: first} }
	for _, c := range []struct {
		name string
		key  keyState
		ls   leaseSet
		want int64
	}{
		{"missing", keyState{}, leaseSet{}, 0},
		{"room now", keyState{exists: true, status: StatusAvailable, limit: 2}, live(1, 1500), now},
		{"full", keyState{exists: true, status: StatusAvailable, limit: 2}, live(2, 1500), 1500},
		{"disabled", keyState{exists: true, status: StatusDisabled, limit: 2}, leaseSet{}, 0},
		{"cooling", keyState{exists: true, status: StatusCooldown, cooldown: "3000", limit: 1}, leaseSet{}, 3000},
		{"cooling and full past it", keyState{exists: true, status: StatusRateLimited, cooldown: "3000", limit: 1}, live(1, 4000), 4000},
		{"cooling, no end", keyState{exists: true, status: StatusRateLimited, limit: 1}, leaseSet{}, 0},
		{"cooldown passed, full", keyState{exists: true, status: StatusRateLimited, cooldown: "10", limit: 1}, live(1, 1200), 1200},
	} {
		require.Equal(t, c.want, freeAt(c.key, c.ls, now), c.name)
	}
}

func TestParseKey(t *testing.T) {
	k := parseKey([]any{"openai", "vip", "cooldown", "123", "abc", "7"})
	require.Equal(t, keyState{exists: true, provider: "openai", pool: "vip", status: StatusCooldown, cooldown: "123", limit: 1, fence: 7}, k)
	require.True(t, k.member("openai", "vip"))
	require.False(t, k.member("openai", "default"))
	require.False(t, parseKey([]any{nil, nil, nil, nil, nil, nil}).exists)
}

func TestEarliest(t *testing.T) {
	require.Equal(t, int64(5), earliest(0, 5))
	require.Equal(t, int64(5), earliest(5, 0))
	require.Equal(t, int64(3), earliest(5, 3))
	require.Equal(t, int64(0), earliest(0, 0))
}

func TestNewRejectsBadPrefix(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	_, err := New(rdb, &Options{Prefix: "a{b"})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = New(nil, nil)
	require.Error(t, err)
}
