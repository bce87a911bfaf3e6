// Package workload drives any optimistic.LeaseStore the way a fleet of
// broker callers would, and audits it: every grant is counted in a holder
// count that the harness keeps on its own, which must never exceed a key's
// limit whatever the store says.
//
// A Spec says how callers pick and order their candidate keys (uniform, Zipf
// θ=0.99 as in YCSB, one hot key; ranked per caller or the same order for
// everyone), how long they hold a slot, how many never release it, and
// whether they run in a closed loop (each caller asks again as soon as it is
// done: maximum goodput) or an open loop (allocations start at a fixed
// offered rate, and latency counts from the intended start, so a slow store
// cannot hide its queueing: no coordinated omission).
package workload
