// Package baseline is the benchmark's reference lease store: the seed
// article's Redis Lua script behind optimistic.LeaseStore. It uses the
// optimistic store's key schema and hash fields (internal/redisschema), so
// a key synced or leased through one store is seen the same way by the
// other.
//
// The seed allocates in one EVAL that loops over every candidate. That is
// fine on a single node but not on Redis Cluster: the candidates live in
// different hash slots, and a script may only touch keys of one slot,
// declared in KEYS. Here allocate.lua runs once per candidate, in the
// caller's order, stopping at the first grant. Each run declares that key's
// HASH, its lease ZSET and the new lease record, which share the key's hash
// tag. Each run is atomic, so a key is never oversold; the list as a whole
// is no longer judged at one instant, which the contract does not ask for.
// The price is one round trip per skipped candidate, where the seed pays
// one per call.
//
// Options.Gate adds the optimistic store's admission control, so that the
// benchmark can compare the two with everything else equal (lua+gate
// against optimistic, lua against optimistic-nogate): a run holds its
// candidate's turn in this process (internal/keygate), and a candidate
// whose turn another call holds goes to the back of the call's list, and
// is waited for only once every candidate left is busy. Each script run
// already covers one candidate, as each WATCH transaction does, so the
// gated loop is the optimistic store's, minus the conflicts a script
// cannot have (and so the hold-offs that pick which busy key to wait
// for: here the first). A script cannot be
// oversold either way; what the turn changes is how many runs a hot key's
// callers spend finding it full.
//
// Unlike the seed, membership is read from the key HASH (same slot) rather
// than the pool ZSET, time is Redis TIME in ms rather than the caller's
// clock, release refuses an expired lease that was not pruned yet, and a
// key the optimistic store held back after finding Redis behind
// (held_until) grants nothing until the hold ends, as in that store.
// Release, Renew, ClearLeases and DeleteKey are scripts as well. SyncKey and
// Inspect decide nothing atomically, so they run the optimistic store's own
// commands.
//
// The scripts write after reading TIME, which needs effects replication:
// the default since Redis 5 and the only mode since Redis 7.
package baseline
