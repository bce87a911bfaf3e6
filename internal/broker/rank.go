package broker

import (
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/credpool/credpool/optimistic"
)

// Candidate is what ranking knows about one key: its catalog history and
// its live capacity from the lease store.
type Candidate struct {
	ID string
	// Free and Limit are live free slots and max_concurrent_uses
	// (Inspect), or for a candidate not read the catalog's limit, all free.
	Free, Limit int
	// Status is the catalog status; rate_limited and cooldown mean the key
	// has just come out of (or is about to leave) a cooldown.
	Status                           optimistic.Status
	LastUsedAt, LastVerifiedAt       time.Time
	Successes, Errors, RateLimitHits int64
}

// Weights tune Rank. The zero value is not useful; start from
// DefaultWeights.
type Weights struct {
	// Capacity weighs the share of free slots (0..1).
	Capacity float64
	// Idle weighs time since last use, capped at IdleCap; never used = 1.
	Idle float64
	// Success weighs the success rate; no history counts as 1.
	Success float64
	// Error and RateLimit weigh the share of errors and rate-limit hits.
	Error, RateLimit float64
	// Cooldown is subtracted from keys still marked rate_limited/cooldown.
	Cooldown float64
	// Freshness weighs how stale last_verified_at is (0..1 over
	// FreshnessHorizon; never verified = 1).
	Freshness float64
	// Jitter is the width of the uniform noise added to every score, so
	// equal keys share the load instead of all callers piling on the first.
	Jitter float64
	// IdleCap is the idle time that earns the full Idle weight (5m in
	// DefaultWeights); with zero only never-used keys count as idle.
	IdleCap time.Duration
	// FreshnessHorizon is the age of last_verified_at that costs the full
	// Freshness weight (24h in DefaultWeights); zero makes every verified
	// key fresh.
	FreshnessHorizon time.Duration
}

// DefaultWeights returns the seed design's weights: capacity first, then
// health, with 0.01 of jitter.
func DefaultWeights() Weights {
	return Weights{
		Capacity: 1, Idle: 0.3, Success: 0.5, Error: 0.5, RateLimit: 0.5,
		Cooldown: 0.3, Freshness: 0.2, Jitter: 0.01,
		IdleCap: 5 * time.Minute, FreshnessHorizon: 24 * time.Hour,
	}
}

// Score is c's weighted score at now, without jitter.
func (w Weights) Score(c Candidate, now time.Time) float64 {
	score := w.Capacity*ratio(float64(c.Free), float64(max(c.Limit, 1))) +
		w.Idle*idle(c.LastUsedAt, now, w.IdleCap)
	total := c.Successes + c.Errors + c.RateLimitHits
	if total == 0 {
		score += w.Success
	} else {
		score += w.Success*ratio(float64(c.Successes), float64(total)) -
			w.Error*ratio(float64(c.Errors), float64(total)) -
			w.RateLimit*ratio(float64(c.RateLimitHits), float64(total))
	}
	if c.Status == optimistic.StatusRateLimited || c.Status == optimistic.StatusCooldown {
		score -= w.Cooldown
	}
	return score - w.Freshness*stale(c.LastVerifiedAt, now, w.FreshnessHorizon)
}

// Rank orders candidates best first by Score plus jitter drawn from rng
// (nil: the global source). Only the order matters to the lease store: it
// takes the first key in it that has a free slot.
func (w Weights) Rank(cands []Candidate, now time.Time, rng *rand.Rand) []string {
	type scored struct {
		id    string
		score float64
	}
	draw := rand.Float64
	if rng != nil {
		draw = rng.Float64
	}
	s := make([]scored, len(cands))
	for i, c := range cands {
		s[i] = scored{c.ID, w.Score(c, now) + w.Jitter*draw()}
	}
	slices.SortStableFunc(s, func(a, b scored) int { return cmp.Compare(b.score, a.score) })
	order := make([]string, len(s))
	for i := range s {
		order[i] = s[i].id
	}
	return order
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return min(max(a/b, 0), 1)
}

// idle is the time since last use as a share of limit; never used is 1.
func idle(last, now time.Time, limit time.Duration) float64 {
	if last.IsZero() {
		return 1
	}
	return ratio(float64(now.Sub(last)), float64(limit))
}

// stale is the age of the last verification as a share of horizon; never
// verified is 1.
func stale(verified, now time.Time, horizon time.Duration) float64 {
	if verified.IsZero() {
		return 1
	}
	return ratio(float64(now.Sub(verified)), float64(horizon))
}

// PoolOrder is the pool fallback order: pools listed for a pool are tried
// after it (not theirs in turn), and borrowing is one-way (vip may borrow
// default, never the reverse; Check refuses an order that is not). A nil
// PoolOrder uses DefaultPoolOrder.
type PoolOrder map[string][]string

// DefaultPoolOrder returns the default order: vip falls back to default.
func DefaultPoolOrder() PoolOrder { return PoolOrder{"vip": {"default"}} }

// Check refuses an order that is not one-way: a pool that falls back to
// itself, or a cycle of fallbacks (vip=default with default=vip), in which
// the pools would borrow from each other.
func (o PoolOrder) Check() error {
	// state: 1 on the path being walked, 2 done.
	state := make(map[string]int)
	var walk func(pool string, path []string) error
	walk = func(pool string, path []string) error {
		switch state[pool] {
		case 1:
			return fmt.Errorf("pool fallback %s: borrowing must be one-way", strings.Join(append(path[slices.Index(path, pool):], pool), " → "))
		case 2:
			return nil
		}
		state[pool] = 1
		for _, f := range o[pool] {
			if err := walk(f, append(path, pool)); err != nil {
				return err
			}
		}
		state[pool] = 2
		return nil
	}
	for _, pool := range slices.Sorted(maps.Keys(o)) {
		if err := walk(pool, nil); err != nil {
			return err
		}
	}
	return nil
}

// Sequence returns pool followed by its fallbacks, without repeats.
func (o PoolOrder) Sequence(pool string) []string {
	if o == nil {
		o = DefaultPoolOrder()
	}
	seq := []string{pool}
	for _, p := range o[pool] {
		if !slices.Contains(seq, p) {
			seq = append(seq, p)
		}
	}
	return seq
}
