package optimistic

import (
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/credpool/credpool/internal/keygate"
	rs "github.com/credpool/credpool/internal/redisschema"
	"github.com/credpool/credpool/internal/retry"
)

// Options configure a Store. A nil *Options means all defaults.
type Options struct {
	// Prefix starts every Redis key name; it must not contain braces.
	//
	// default: "credpool"
	Prefix string

	// MaxRetries bounds the pauses in one Allocate (or DeleteKey,
	// ClearLeases) call; Renew and Release never retry. Allocate pauses when
	// every candidate left had its commit aborted twice in a row, or after
	// an EXEC whose reply was lost; it then tries those candidates again.
	//
	// default: 10
	MaxRetries int

	// MinBackoff is the first pause; later pauses grow by 2x with ±50%
	// jitter. A short first pause serves a key of several slots; the long
	// tail throttles a herd on one hot key.
	//
	// default: 200µs
	MinBackoff time.Duration

	// MaxBackoff caps the pause before its jitter: a pause is at most
	// 1.5x MaxBackoff.
	//
	// default: 64ms
	MaxBackoff time.Duration

	// MaxElapsed bounds the time from a call's first try to its last
	// pause; it is checked at each pause, so a pass already running
	// finishes. Time spent in a pass waiting for a key's turn, or for a
	// hold-off to end, counts: a call that waited longer than this in line
	// gives up at its next conflict instead of pausing.
	//
	// default: 2s
	MaxElapsed time.Duration

	// RecordGrace is how long a lease record outlives its lease before Redis
	// expires it by itself (it is normally deleted earlier, by release or
	// prune).
	//
	// default: 1m
	RecordGrace time.Duration

	// MinReplicas, when positive, makes a grant (one recovered after a lost
	// EXEC reply too) or a renewal count only once that many replicas have
	// acknowledged it (WAIT, in the same round trip as EXEC), so that a
	// failover to one of them cannot lose it. A grant too few acknowledged
	// within ReplicaTimeout is given back and Allocate fails with ErrStore;
	// a renewal fails with ErrStore and the lease keeps its previous expiry
	// as far as a failover is concerned.
	//
	// default: 0 (off)
	MinReplicas int

	// ReplicaTimeout bounds the wait for MinReplicas acknowledgements; the
	// connection is held that long when replicas lag.
	//
	// default: 100ms
	ReplicaTimeout time.Duration

	// NoGate turns off the per-key turn (internal/keygate) that Allocate,
	// DeleteKey and ClearLeases take within this process: every call then
	// races in its own transaction, as calls of separate processes do. It
	// exists to measure what the turn gives (the benchmark's
	// optimistic-nogate); a hot key aborts far more EXECs without it.
	//
	// default: false (gate on)
	NoGate bool

	// LostHold is how long a key is held back once this store finds its
	// state older than a grant it saw there (its own, or one a read
	// found): Redis came back from an older copy (an RDB snapshot, an
	// AOF that lost its last second, a failover to a replica that had not
	// caught up), and leases granted since may be in use while the store
	// no longer counts them. The hold is written into the key HASH, so
	// every process refuses the key until it ends; set it to the longest
	// a lease may live, renewals included. Less than a second is taken as
	// a second.
	//
	// default: 1h
	LostHold time.Duration
}

func (o *Options) withDefaults() Options {
	var out Options
	if o != nil {
		out = *o
	}
	if out.Prefix == "" {
		out.Prefix = rs.DefaultPrefix
	}
	if out.MaxRetries <= 0 {
		out.MaxRetries = 10
	}
	if out.MinBackoff <= 0 {
		out.MinBackoff = 200 * time.Microsecond
	}
	if out.MaxBackoff <= 0 {
		out.MaxBackoff = 64 * time.Millisecond
	}
	if out.MaxElapsed <= 0 {
		out.MaxElapsed = 2 * time.Second
	}
	if out.RecordGrace <= 0 {
		out.RecordGrace = time.Minute
	}
	if out.ReplicaTimeout <= 0 {
		out.ReplicaTimeout = 100 * time.Millisecond
	}
	if out.LostHold <= 0 {
		out.LostHold = time.Hour
	}
	// A hold leaves the fence as the store came back with: it must
	// outlast fenceFresh, or a handoff right after it could hand out a
	// lost handoff's token again.
	out.LostHold = max(out.LostHold, fenceFresh)
	return out
}

// Store is the lease store on Redis WATCH/MULTI. It is safe for concurrent
// use; every in-flight transaction holds one pooled connection, so the
// client's PoolSize bounds concurrent calls and PoolTimeout turns an
// exhausted pool into an ErrStore.
type Store struct {
	rdb    redis.UniversalClient
	opts   Options
	keys   rs.Schema
	policy retry.Policy
	gates  keygate.Set
	// lines holds the calls waiting for a key's turn (see ticket).
	lines lines
	// id signs this store's free-slot notices (see Await).
	id      string
	queue   Queue
	notices notices
	// cluster says rdb is a Redis Cluster client: only there can some keys
	// be unreachable while others answer.
	cluster bool
	// replicaReads says rdb may send plain reads (Inspect's) to replicas,
	// which lag: those neither count as seen nor find a key behind (see
	// lost.go).
	replicaReads bool
	// notes is what Allocate learned of keys from its last attempts.
	notes notes
	// releases sends concurrent releases to a server together.
	releases coalescer
	// clock is each server's clock as releases read it, and fences the
	// last fence granted on each key, as this process saw them (see
	// handoff).
	clock  storeClock
	fences fences
	// seqs is the highest grant count this process saw on each key,
	// granted or read (see lost.go).
	seqs fences
	// fenceFresh is fenceFresh; tests that are not about it lengthen it.
	fenceFresh time.Duration
	// announceEvery, heardWithin and turnSlack are announceEvery,
	// heardWithin and turnSlack (see Store.turn); tests change them.
	announceEvery, heardWithin, turnSlack time.Duration
}

// New returns a Store over rdb: a standalone, Sentinel (failover) or Cluster
// client.
func New(rdb redis.UniversalClient, opts *Options) (*Store, error) {
	if rdb == nil {
		return nil, errors.New("optimistic: nil redis client")
	}
	o := opts.withDefaults()
	if !rs.ValidPrefix(o.Prefix) {
		return nil, invalidf("prefix %q must not contain braces", o.Prefix)
	}
	c, cluster := rdb.(*redis.ClusterClient)
	var replicaReads bool
	if cluster {
		co := c.Options()
		replicaReads = co.ReadOnly || co.RouteByLatency || co.RouteRandomly
	}
	return &Store{
		rdb: rdb, opts: o, keys: rs.Schema{Prefix: o.Prefix}, cluster: cluster, replicaReads: replicaReads,
		id: uuid.NewString(), fenceFresh: fenceFresh,
		announceEvery: announceEvery, heardWithin: heardWithin, turnSlack: turnSlack,
		policy: retry.Policy{MaxRetries: o.MaxRetries, MinBackoff: o.MinBackoff, MaxBackoff: o.MaxBackoff, MaxElapsed: o.MaxElapsed},
	}, nil
}
