package broker

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/optimistic"
)

func TestScore(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	w := DefaultWeights()
	w.Jitter = 0
	fresh := Candidate{Free: 2, Limit: 2, Status: optimistic.StatusAvailable, LastVerifiedAt: now}
	with := func(f func(*Candidate)) Candidate { c := fresh; f(&c); return c }
	for _, c := range []struct {
		name string
		c    Candidate
		want float64
	}{
		{"idle, healthy, all free", fresh, 1 + 0.3 + 0.5},
		{"half free", with(func(c *Candidate) { c.Free = 1 }), 0.5 + 0.3 + 0.5},
		{"used just now", with(func(c *Candidate) { c.LastUsedAt = now }), 1 + 0 + 0.5},
		{"idle 150s of 300s cap", with(func(c *Candidate) { c.LastUsedAt = now.Add(-150 * time.Second) }), 1 + 0.15 + 0.5},
		{"idle past the cap", with(func(c *Candidate) { c.LastUsedAt = now.Add(-time.Hour) }), 1 + 0.3 + 0.5},
		{"history 2 ok, 1 error, 1 rate limit", with(func(c *Candidate) { c.Successes, c.Errors, c.RateLimitHits = 2, 1, 1 }), 1 + 0.3 + 0.25 - 0.125 - 0.125},
		{"cooldown", with(func(c *Candidate) { c.Status = optimistic.StatusCooldown }), 1 + 0.3 + 0.5 - 0.3},
		{"never verified", with(func(c *Candidate) { c.LastVerifiedAt = time.Time{} }), 1 + 0.3 + 0.5 - 0.2},
		{"verified 12h ago", with(func(c *Candidate) { c.LastVerifiedAt = now.Add(-12 * time.Hour) }), 1 + 0.3 + 0.5 - 0.1},
		{"limit 0 read as 1", with(func(c *Candidate) { c.Free, c.Limit = 1, 0 }), 1 + 0.3 + 0.5},
	} {
		require.InDelta(t, c.want, w.Score(c.c, now), 1e-9, c.name)
	}
}

func TestRank(t *testing.T) {
	now := time.Now()
	w := DefaultWeights()
	full := Candidate{ID: "full", Free: 0, Limit: 1, Status: optimistic.StatusAvailable}
	free := Candidate{ID: "free", Free: 1, Limit: 1, Status: optimistic.StatusAvailable}
	errs := Candidate{ID: "errs", Free: 1, Limit: 1, Status: optimistic.StatusAvailable, Errors: 9, Successes: 1}
	rng := rand.New(rand.NewPCG(1, 2))
	require.Equal(t, []string{"free", "errs", "full"}, w.Rank([]Candidate{full, errs, free}, now, rng))

	// Jitter spreads equal keys: each of three twins comes first sometimes.
	twins := []Candidate{{ID: "a", Free: 1, Limit: 1}, {ID: "b", Free: 1, Limit: 1}, {ID: "c", Free: 1, Limit: 1}}
	first := map[string]int{}
	for range 300 {
		first[w.Rank(twins, now, rng)[0]]++
	}
	require.Len(t, first, 3, "first picks: %v", first)

	// Without jitter the order is stable: the seed's "no jitter" pathology.
	w.Jitter = 0
	for range 10 {
		require.Equal(t, []string{"a", "b", "c"}, w.Rank(twins, now, nil))
	}
}

func TestPoolOrderSequence(t *testing.T) {
	require.Equal(t, []string{"vip", "default"}, PoolOrder(nil).Sequence("vip"))
	require.Equal(t, []string{"default"}, PoolOrder(nil).Sequence("default"), "default never borrows vip")
	o := PoolOrder{"gold": {"silver", "gold", "bronze", "silver"}}
	require.Equal(t, []string{"gold", "silver", "bronze"}, o.Sequence("gold"))
	require.Equal(t, []string{"vip"}, o.Sequence("vip"), "a configured order replaces the default")
}
