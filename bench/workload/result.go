package workload

import "time"

// Result is what a run did; results of several processes merge into one.
type Result struct {
	// Calls counts Allocate calls, split into Grants, NoSlot (ErrNoCapacity),
	// GiveUps (ErrContended: conflict retries used up) and Errors (anything
	// else, such as ErrStore).
	Calls, Grants, NoSlot, GiveUps, Errors int64
	// Attempts, Conflicts and Pruned add up the stores' Stats.
	Attempts, Conflicts, Pruned int64
	// Released counts releases that succeeded and Crashed grants whose
	// holder never released. Lost counts releases refused because the
	// lease had expired while held: the TTL was too short for the run, and
	// the audit cannot vouch for that slot. ReleaseErrors counts other
	// failed releases.
	Released, Crashed, Lost, ReleaseErrors int64
	// Offered is how many calls an open loop was to start within Duration;
	// fewer Calls mean the callers could not keep up: the calls still due
	// when the run ended were never made. Zero in a closed loop.
	Offered int64
	// Violations counts grants the audit refused: the key's holder count
	// went above its limit, or the key was not among the candidates.
	// MaxHolders is the highest holder count of any key seen at a grant.
	Violations, MaxHolders int64
	FirstViolation         string `json:",omitempty"`
	FirstError             string `json:",omitempty"`
	// Elapsed is the wall time from the start until the last caller stopped
	// (the longest of the merged runs).
	Elapsed time.Duration
	// Latency has every Allocate call, from its intended start (its actual
	// start in a closed loop) to its return; GrantLatency only the grants.
	Latency, GrantLatency *Histogram
	// TimeToGrant has every grant, from the start of the caller's first
	// call for it to the return of the call that got it: in a closed loop
	// the calls that found no slot and the pauses after them count too.
	// (In an open loop each call is a request of its own, so it equals
	// GrantLatency.) Callers still without a grant when the run ended are
	// in it with their wait so far, a lower bound, so that starvation
	// shows; Waiting counts them.
	TimeToGrant *Histogram
	Waiting     int64
	// CallerGrants has each caller's grants, one entry per caller; a
	// merged result lists the callers of every process.
	CallerGrants []int64
	// Held counts the holds of more than zero that ran while the run was
	// on, and HoldExcess adds up by how much each ran past the time it was
	// meant to last: the harness's clock and scheduling, which every
	// grant's cycle includes. ShortHolds counts those that ended early,
	// which a correct clock never does.
	Held, ShortHolds int64
	HoldExcess       time.Duration
}

// Merge adds o's counts and latencies into r.
func (r *Result) Merge(o *Result) {
	r.Calls += o.Calls
	r.Grants += o.Grants
	r.NoSlot += o.NoSlot
	r.GiveUps += o.GiveUps
	r.Errors += o.Errors
	r.Attempts += o.Attempts
	r.Conflicts += o.Conflicts
	r.Pruned += o.Pruned
	r.Released += o.Released
	r.Crashed += o.Crashed
	r.Lost += o.Lost
	r.ReleaseErrors += o.ReleaseErrors
	r.Offered += o.Offered
	r.Waiting += o.Waiting
	r.Violations += o.Violations
	r.MaxHolders = max(r.MaxHolders, o.MaxHolders)
	if r.FirstViolation == "" {
		r.FirstViolation = o.FirstViolation
	}
	if r.FirstError == "" {
		r.FirstError = o.FirstError
	}
	r.Elapsed = max(r.Elapsed, o.Elapsed)
	r.Latency = mergeHist(r.Latency, o.Latency)
	r.GrantLatency = mergeHist(r.GrantLatency, o.GrantLatency)
	r.TimeToGrant = mergeHist(r.TimeToGrant, o.TimeToGrant)
	r.CallerGrants = append(r.CallerGrants, o.CallerGrants...)
	r.Held += o.Held
	r.ShortHolds += o.ShortHolds
	r.HoldExcess += o.HoldExcess
}

func mergeHist(into, from *Histogram) *Histogram {
	if from == nil {
		return into
	}
	if into == nil {
		into = NewHistogram()
	}
	into.Merge(from)
	return into
}
