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
//  1. WATCH the key HASH and lease ZSET, TIME, HMGET the key, ZRANGE the
//     leases (pipelined). Decide in Go: not a member, not usable or full
//     means UNWATCH and the next candidate.
//  2. MULTI: prune the expired leases and their records, ZADD the lease,
//     write its record, mark the key available; EXEC.
//
// A lease's ZSET member, and the name of its record, carry its owner
// (<lease id>/<provider>/<pool>), so Release is one MULTI that can only
// remove the caller's own lease.
//
// Within one process, allocations on the same credential take turns (a
// gate per key id), so a process's callers that pile onto a hot key do not
// abort each other's EXECs. A caller that finds a candidate's gate taken
// tries the other candidates first and waits for that one last.
//
// An aborted EXEC is a conflict: the candidate is read again at once, and
// after a second conflict set aside while the next candidates are tried;
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
package optimistic
