// Package redisschema names the Redis keys and hash fields of DESIGN.md
// ("Redis key schema"), shared by every Redis-backed lease store (the
// WATCH/MULTI store in optimistic and the Lua baseline in bench/baseline)
// and the request log beside them (internal/requestlog). A key synced or
// leased through one store is seen the same way by the other.
package redisschema

import "strings"

// DefaultPrefix starts every key name unless a store is given another
// prefix. Stores, and the request log beside them, must agree on it.
const DefaultPrefix = "credpool"

// Schema names the Redis keys under one prefix. Every key of one
// credential carries the hash tag {<key id>}, so each transaction touches
// one slot and works on Redis Cluster. Ids must already be valid
// (optimistic.ValidID): they can then never break a tag or a name.
type Schema struct{ Prefix string }

// ValidPrefix reports whether p may start key names: non-empty and without
// braces, which would put a hash tag before the credential's own.
func ValidPrefix(p string) bool {
	return p != "" && !strings.ContainsAny(p, "{}")
}

// Pool is the ZSET of key ids of one provider/pool (ops score, never read by
// Allocate).
func (s Schema) Pool(provider, pool string) string {
	return s.Prefix + ":pool:{" + provider + "/" + pool + "}"
}

// Key is the HASH with the credential's allocation state (Field* below).
func (s Schema) Key(keyID string) string { return s.Prefix + ":key:{" + keyID + "}" }

// Leases is the ZSET of the key's leases, scored by expiry in ms.
func (s Schema) Leases(keyID string) string { return s.Key(keyID) + ":leases" }

// Free is the sharded pub/sub channel told when a slot of the key may have
// freed up (a release, say); it hashes to the key's slot, so on Redis
// Cluster the notice goes to the node that holds the key, in the same
// round trip as the release.
func (s Schema) Free(keyID string) string { return s.Key(keyID) + ":free" }

// Turns is the sharded pub/sub channel on which the stores whose callers
// wait for the key say so (see optimistic's Store.turn). It hashes to the
// key's slot too, so a store hears it on its Free channel's connection, in
// the order the server ran the two channels' SPUBLISHes.
func (s Schema) Turns(keyID string) string { return s.Key(keyID) + ":turns" }

// IsTurns reports whether channel is a Turns channel.
func IsTurns(channel string) bool { return strings.HasSuffix(channel, ":turns") }

// FreeKeyID returns the key id of a Free or Turns channel name.
func FreeKeyID(channel string) (string, bool) {
	_, rest, ok := strings.Cut(channel, "{")
	if !ok {
		return "", false
	}
	id, _, ok := strings.Cut(rest, "}")
	return id, ok
}

// Lease is the HASH recording a lease, named after its Member.
func (s Schema) Lease(keyID, member string) string {
	return s.Key(keyID) + ":lease:" + member
}

// Member is a lease's member in its key's lease ZSET:
// "<lease id>/<provider>/<pool>". Ids hold no '/', so the owner is part of
// the name: a release or renewal that gives another provider or pool names
// another member (and record), and removes or extends nothing. The key id
// is in the ZSET's own name. Leases written before owners were encoded
// have the bare lease id as member.
func Member(leaseID, provider, pool string) string {
	return leaseID + "/" + provider + "/" + pool
}

// OfLease reports whether member is a lease of leaseID, under any provider
// and pool.
func OfLease(member, leaseID string) bool {
	return strings.HasPrefix(member, leaseID+"/")
}

// Request is the string that remembers which lease answered an allocate
// request id.
func (s Schema) Request(id string) string { return s.Prefix + ":req:{" + id + "}" }

// RequestByLease is the string naming the allocate request id that a lease
// answered, so that renewing the lease can find the request's record. It
// hashes to the lease's slot, not the request's.
func (s Schema) RequestByLease(leaseID string) string {
	return s.Prefix + ":req-lease:{" + leaseID + "}"
}

// Probe is the short-lived string that shows a server takes writes (see
// optimistic.Store.Nodes); on a cluster, tag puts it on a slot of the
// server's.
func (s Schema) Probe(tag string) string { return s.Prefix + ":probe:{" + tag + "}" }

// StoreID is the string holding the store's id, written once (SET NX,
// no expiry) by the service, which names the store by it in its catalog.
// Its hash tag is its own, so on a cluster it lives on one slot, whose
// master must answer when an instance starts.
func (s Schema) StoreID() string { return s.Prefix + ":{store-id}" }

// Field names of the key HASH and the lease record HASH. The Lua scripts
// of bench/baseline spell the same names.
const (
	FieldProvider = "provider"
	FieldPool     = "pool"
	FieldStatus   = "status"
	FieldCooldown = "cooldown_until"
	FieldLimit    = "max_concurrent_uses"
	FieldLastUsed = "last_used_at"
	FieldFence    = "fence"
	// FieldSeq counts the key's grants, from the clock (µs) when the
	// HASH was made; FieldHeld (ms) is set by a store that found the
	// count below one it saw: no grant until then (see
	// optimistic.Options.LostHold).
	FieldSeq   = "seq"
	FieldHeld  = "held_until"
	FieldKeyID = "key_id"
	FieldUntil = "lease_until"
)
