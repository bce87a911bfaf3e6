package optimistic

import (
	"errors"
	"strings"
	"testing"
	"time"

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
		held bool
	}{
		{"missing", keyState{}, leaseSet{}, 0, false},
		{"room now", keyState{exists: true, status: StatusAvailable, limit: 2}, live(1, 1500), now, false},
		{"full", keyState{exists: true, status: StatusAvailable, limit: 2}, live(2, 1500), 1500, true},
		{"disabled", keyState{exists: true, status: StatusDisabled, limit: 2}, leaseSet{}, 0, false},
		{"disabled and full", keyState{exists: true, status: StatusDisabled, limit: 1}, live(1, 1500), 0, false},
		{"cooling", keyState{exists: true, status: StatusCooldown, cooldown: "3000", limit: 1}, leaseSet{}, 3000, false},
		{"cooling and full past it", keyState{exists: true, status: StatusRateLimited, cooldown: "3000", limit: 1}, live(1, 4000), 4000, true},
		{"cooling past a full key's lease", keyState{exists: true, status: StatusRateLimited, cooldown: "3000", limit: 1}, live(1, 2000), 3000, false},
		{"cooling ends as the lease does", keyState{exists: true, status: StatusRateLimited, cooldown: "3000", limit: 1}, live(1, 3000), 3000, true},
		{"cooling, no end", keyState{exists: true, status: StatusRateLimited, limit: 1}, leaseSet{}, 0, false},
		{"cooldown passed, full", keyState{exists: true, status: StatusRateLimited, cooldown: "10", limit: 1}, live(1, 1200), 1200, true},
	} {
		at, held := freeAt(c.key, c.ls, now)
		require.Equal(t, c.want, at, c.name)
		require.Equal(t, c.held, held, c.name)
	}
}

func TestCapacityErrorMerge(t *testing.T) {
	at := func(ms int64) time.Time { return time.UnixMilli(ms) }
	for _, c := range []struct {
		name string
		in   []CapacityError // merged in this order
		want CapacityError
	}{
		{"nothing", nil, CapacityError{}},
		{"never frees up", []CapacityError{{}, {}}, CapacityError{}},
		{"never, then a cooldown", []CapacityError{{}, {FreeAt: at(5)}}, CapacityError{FreeAt: at(5)}},
		{"earlier wins", []CapacityError{{FreeAt: at(5), Held: true}, {FreeAt: at(3)}}, CapacityError{FreeAt: at(3)}},
		{"later loses", []CapacityError{{FreeAt: at(3)}, {FreeAt: at(5), Held: true}, {}}, CapacityError{FreeAt: at(3)}},
		{"tie: held if either", []CapacityError{{FreeAt: at(3), Held: true}, {FreeAt: at(3)}}, CapacityError{FreeAt: at(3), Held: true}},
		{"tie the other way", []CapacityError{{FreeAt: at(3)}, {FreeAt: at(3), Held: true}}, CapacityError{FreeAt: at(3), Held: true}},
	} {
		var got CapacityError
		for _, e := range c.in {
			got.Merge(e.FreeAt, e.Held)
		}
		require.Equal(t, c.want, got, c.name)
	}
}

func TestNotHeld(t *testing.T) {
	const id = "0f8fad5b-d9cb-469f-a165-70867728950e"
	for why, want := range map[Loss]string{
		LostUnknown:  "optimistic: lease lost: lease " + id + " is unknown, released or expired",
		LostMismatch: "optimistic: lease lost: it belongs to another key, provider or pool: lease " + id,
		LostExpired:  "optimistic: lease lost: lease " + id + " expired",
	} {
		err := NotHeld(id, why)
		require.EqualError(t, err, want)
		require.ErrorIs(t, err, ErrLeaseLost)
		require.Equal(t, why == LostMismatch, errors.Is(err, ErrLeaseMismatch), why)
	}
}

func TestParseKey(t *testing.T) {
	k := parseKey([]any{"openai", "vip", "cooldown", "123", "abc", "7", "1700000000000"})
	require.Equal(t, keyState{exists: true, provider: "openai", pool: "vip", status: StatusCooldown, cooldown: "123", limit: 1, fence: 7, lastUsed: 1700000000000}, k)
	require.True(t, k.member("openai", "vip"))
	require.False(t, k.member("openai", "default"))
	require.False(t, parseKey([]any{nil, nil, nil, nil, nil, nil, nil}).exists)
}

func TestNewRejectsBadPrefix(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	_, err := New(rdb, &Options{Prefix: "a{b"})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = New(nil, nil)
	require.Error(t, err)
}
