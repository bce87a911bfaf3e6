package workload

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/credpool/credpool/optimistic"
)

// Provider and Pool hold every key of a workload.
const (
	Provider = "bench"
	Pool     = "default"
)

// Choice is how a caller draws its candidate keys.
type Choice string

// The key choices.
const (
	// Uniform draws every key with the same probability.
	Uniform Choice = "uniform"
	// Zipf draws key i with probability proportional to 1/(i+1)^0.99, as
	// YCSB's zipfian request distribution: key 0 is the hottest.
	Zipf Choice = "zipf"
	// Hot always puts key 0 first; further candidates are uniform.
	Hot Choice = "hot"
)

// Order is how a caller orders its candidates.
type Order string

// The candidate orders.
const (
	// Ranked keeps each caller's own order: the order of its draws, as if a
	// ranking favoured popular keys and jitter broke the ties differently
	// for every caller.
	Ranked Order = "ranked"
	// Identical gives every caller the same list, keys 0 to Candidates-1 in
	// that order: the seed's ranking without jitter, where equal scores
	// sort the same way for everyone. The key choice is ignored.
	Identical Order = "identical"
)

// HoldDist is the distribution of hold times.
type HoldDist string

// The hold time distributions.
const (
	Fixed       HoldDist = "fixed"
	Exponential HoldDist = "exp"
)

// ZipfTheta is YCSB's default skew.
const ZipfTheta = 0.99

// Spec is one workload in one process. It travels to worker processes as
// JSON, so every field is plain data.
type Spec struct {
	// Keys is the number of keys, all in Provider/Pool.
	Keys int
	// Limit is every key's max_concurrent_uses.
	Limit int
	// Candidates is the length of each caller's candidate list, at most Keys.
	Candidates int
	Choice     Choice
	Order      Order
	// Workers is the number of concurrent callers.
	Workers int
	// Hold is how long a caller keeps a granted slot before it releases it:
	// exactly, or on average when HoldDist is Exponential.
	Hold     time.Duration
	HoldDist HoldDist
	// Duration bounds the run, whatever Ops says.
	Duration time.Duration
	// Ops, when positive, ends the run after that many Allocate calls.
	Ops int64
	// Rate, when positive, makes it an open loop: Allocate calls start at
	// Rate per second, each at its own intended instant. A call due before
	// the end that no caller is free to start by then is not made. Zero is
	// a closed loop.
	Rate float64
	// CrashShare is the share of grants whose holder dies: it stops using
	// the key at once and never releases, so the slot comes back only when
	// the lease expires. The audit counts it as a holder until 100ms
	// before then.
	CrashShare float64
	// TTL is the lease length. It must outlast any hold by far: a lease
	// that expires while held would let the store grant the slot again,
	// which the audit would rightly report.
	TTL time.Duration
	// Pause is how long a closed-loop caller waits (±50%) after "no slot",
	// a give-up or an error before it asks again, as a client honouring a
	// 429 would.
	Pause time.Duration
	// Wait, when positive, makes the callers of a closed loop wait in line
	// for a slot (AllocateRequest.Wait) up to this long per call, never
	// past the end of the run, instead of taking "no slot" at once: they
	// never pause (Pause is unused), and the store must be an
	// optimistic.Waiter. Zero is retrying callers.
	Wait time.Duration
}

// Validate returns an error naming the first field out of range.
func (s Spec) Validate() error {
	switch {
	case s.Keys < 1:
		return errors.New("workload: keys must be at least 1")
	case s.Limit < 1:
		return errors.New("workload: limit must be at least 1")
	case s.Candidates < 1 || s.Candidates > s.Keys:
		return fmt.Errorf("workload: candidates %d must be between 1 and keys (%d)", s.Candidates, s.Keys)
	case s.Workers < 1:
		return errors.New("workload: workers must be at least 1")
	case s.Hold < 0:
		return errors.New("workload: hold must not be negative")
	case s.Duration <= 0:
		return errors.New("workload: duration must be positive")
	case s.Ops < 0 || s.Rate < 0:
		return errors.New("workload: ops and rate must not be negative")
	case s.CrashShare < 0 || s.CrashShare > 1:
		return errors.New("workload: crash share must be between 0 and 1")
	case s.TTL < time.Millisecond:
		return errors.New("workload: ttl must be at least 1ms")
	case s.Pause < 0:
		return errors.New("workload: pause must not be negative")
	case s.Wait < 0:
		return errors.New("workload: wait must not be negative")
	case s.Wait > 0 && s.Rate > 0:
		return errors.New("workload: waiting callers need a closed loop (rate 0)")
	}
	switch s.Choice {
	case Uniform, Zipf, Hot:
	default:
		return fmt.Errorf("workload: unknown key choice %q", s.Choice)
	}
	switch s.Order {
	case Ranked, Identical:
	default:
		return fmt.Errorf("workload: unknown order %q", s.Order)
	}
	switch s.HoldDist {
	case Fixed, Exponential:
	default:
		return fmt.Errorf("workload: unknown hold distribution %q", s.HoldDist)
	}
	return nil
}

// KeyID names key i.
func KeyID(i int) string { return "k" + strconv.Itoa(i) }

// KeyIDs names all keys of s, key 0 first.
func (s Spec) KeyIDs() []string {
	ids := make([]string, s.Keys)
	for i := range ids {
		ids[i] = KeyID(i)
	}
	return ids
}

// Key is key i's allocation state, to sync into a store before a run.
func (s Spec) Key(i int) optimistic.KeyState {
	return optimistic.KeyState{
		ID: KeyID(i), Provider: Provider, Pool: Pool,
		Status: optimistic.StatusAvailable, MaxConcurrentUses: s.Limit,
	}
}
