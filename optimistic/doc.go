// Package optimistic leases rate-limited upstream credentials without ever
// exceeding a key's max_concurrent_uses, however many allocator processes
// race for it.
//
// A caller asks for a slot on the first of a ranked list of key ids and gets
// a Lease (key id, unguessable lease id, expiry, fencing token). It releases
// the lease when done or renews it as a heartbeat; a crashed caller's lease
// expires and its slot comes back by itself. Ranking is the caller's job:
// the store only takes "the first key in this order with a free slot".
//
// # The contract
//
// LeaseStore is the contract every store implements: the WATCH/MULTI Store
// here, the Lua baseline of the benchmark and the SQLite store of credpool
// serve. A key's allocation state (KeyState) is synced into a store from
// the source of truth; Inspect reads it back live (KeyInfo). The rules
// every store applies are functions here, so stores agree: ValidID,
// CheckKeyIDs and CheckTTL on input, ParseLimit, Usable and FreeAt on
// stored state. Package optimistic/leasetest proves a store against the
// contract with one call.
//
// Outcomes are kept apart with sentinel errors: ErrNoCapacity (a normal
// "try later", as a *CapacityError carrying when a slot may free up),
// ErrContended, ErrStore, ErrLeaseLost and ErrLeaseMismatch, ErrInvalid,
// and the context's own error when ctx ends first. ErrConflict is the one neutral mark of a lost race (an aborted
// EXEC, a busy SQLite file): stores retry it and Classify turns one that
// outlived the retries into ErrContended, so no caller needs a backend's
// error types.
//
// # The Redis store
//
// Store implements the contract on Redis with optimistic transactions, no
// Lua. One attempt on one candidate is two round trips when uncontended:
//
//  1. WATCH the key HASH, TIME, HMGET the key, ZRANGE the leases
//     (pipelined). Decide in Go: not a member, not usable or full means
//     the next candidate.
//  2. MULTI: ZADD the lease, write its record, mark the key available;
//     EXEC.
//
// A skipped candidate costs its read alone: the WATCH it leaves on the
// connection is dropped by an UNWATCH at the head of the next candidate's
// read, on the same connection, and a call that skipped them all sends
// one UNWATCH before the connection goes back to the pool. k full
// candidates and a grant are k+2 round trips. A key this process skipped
// in the last 50ms (skipFor; a hot key, full) is first read without WATCH:
// while it stays full that read is the whole attempt, and no UNWATCH
// follows; when it has room, the read under WATCH and the MULTI follow, a
// grant of three round trips.
//
// Every grant writes the key HASH, as do syncs and deletes, so watching
// the HASH aborts any EXEC that another write could make one lease too
// many. Releases, renewals and clear-outs touch only the lease ZSET: they
// free slots or extend live leases, which cannot overfill a key, and so
// do not abort grants. The exception is an expired lease, which a renewal
// that read it live may extend after the grant counted it out: a grant
// that would prune expired leases (with their records, in the same MULTI)
// first reads again watching the ZSET too, one round trip more.
//
// A lease's ZSET member, and the name of its record, carry its owner
// (<lease id>/<provider>/<pool>), so Release is one MULTI that can only
// remove the caller's own lease.
//
// Within one process, allocations on the same credential take turns (a
// gate per key id), so a process's callers that pile onto a hot key do not
// abort each other's EXECs. A caller that finds a candidate's gate taken
// tries the other candidates first; when all it has left are busy, it
// waits for the one likely to come free first.
// Options.NoGate turns the turns off (package internal/keygate keeps them,
// and the benchmark's Lua baseline can take the same ones).
//
// An aborted EXEC is a conflict: another process won the race for the
// key. The loser's process then stays off that key for a few times the
// attempt's duration, twice that after a second loss in a row (a
// hold-off, see holdOffSpan; not with Options.NoGate, where each call
// races on its own), so that processes on a hot key take turns instead of
// colliding on every freed slot; its callers try their other candidates
// meanwhile, or wait. The candidate is then read again, and after a
// second conflict set aside while the next candidates are tried;
// only when all that are left were set aside does the call pause (jittered
// exponential backoff, bounded by Options.MaxRetries and
// Options.MaxElapsed) and try them again. Pruning happens only inside
// MULTI, since a write on our own connection between WATCH and EXEC would
// abort our own EXEC. Time is Redis TIME in milliseconds, so allocators
// with skewed clocks agree.
//
// Every key of one credential shares a hash tag ({<key id>}, see DESIGN.md
// "Redis key schema"), so each transaction stays in one slot and the store
// works on Redis Cluster.
//
// # Waiting for a slot
//
// AllocateRequest.Wait turns "no free slot" into a wait in line: callers
// of one process queue per key in arrival order (Queue), a freed slot
// wakes the first of them, and releases in other processes reach the line
// through the key's sharded pub/sub channel, notified in the release's
// round trip, right after its EXEC (Store.Await). FreeAt and WaitPoll
// bound what a lost notice costs. Waiter is the contract for stores that
// can wait.
//
// A release in this process hands its slot to the first caller waiting
// here in the release's own MULTI (one round trip for a release and a
// grant; the slot is never free in between), checked by what that MULTI
// reads back: see Store.Release. While callers of other processes wait
// for the key too, the processes take turns: stores that wait say so on
// the key's Turns channel, with how long their first caller has waited, and a
// release keeps the slot for its own line unless another's has waited
// turnSlack longer; then the notice names that store, and only its first
// caller wakes (Store.turn). Callers that do not wait find such a key
// full until the lines are empty.
package optimistic
