// Package sqlitestore is the lease store of DESIGN.md on one SQLite file,
// for a single host: the embedded default of credpool serve. It is
// pessimistic (one writer at a time, no optimistic conflicts), satisfies
// optimistic.LeaseStore and passes the same conformance suite
// (optimistic/leasetest) as the Redis stores.
//
// # Locking
//
// Every call that writes runs in one BEGIN IMMEDIATE transaction, which takes
// SQLite's write lock up front. The lock serialises allocators in this
// process and in every other process that opens the same file, so Allocate
// reads and claims a slot without optimistic conflicts. sqlitex.Open sets
// _txlock=immediate so that database/sql begins transactions that way. Over a
// db opened without it, transactions stay serialisable, but one that reads
// before it writes fails busy when another commits first and is retried:
// correct, only slower. Inspect reads in a deferred transaction and, in WAL
// mode, never waits for writers.
//
// Within one process, write transactions first queue on the gate of the
// sqlitex.DB (shared with the catalog and the request log on the same
// file), in arrival order, until ctx ends. SQLite's busy handler polls a taken lock with
// sleeps of up to 100ms; the gate hands it on at once. Measured with 64
// goroutines racing on one key, rounds ran about 6x faster, and the stress
// test's releases stopped running out of busy retries. The busy handler is
// left to arbitrate between processes.
//
// # Busy handling
//
// A transaction that cannot get the lock first waits in SQLite's busy handler
// (busy_timeout, set by sqlitex.Open). If that wait runs out, or SQLite
// reports the database busy or locked in any other way, the transaction is
// rolled back and retried after a jittered, growing pause (internal/retry);
// Stats.Conflicts counts these retries. Busy is SQLite's kind of conflict:
// it is marked optimistic.ErrConflict, and when the retry budget runs out
// the call fails with optimistic.ErrContended, never with
// optimistic.ErrNoCapacity. If ctx ends first, the error carries both the
// busy cause and ctx's error.
//
// # Clock
//
// The store's clock is this process's wall clock (time.Now), read in
// milliseconds once per transaction, after the lock is taken. SQLite runs in
// the calling process, so its own unixepoch() would read the same clock; one
// value from Go keeps every statement of a transaction at the same instant.
// All processes sharing a file run on its host and so share that clock.
package sqlitestore
