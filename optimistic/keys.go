package optimistic

import (
	"strings"
	"time"
)

// maxIDLen bounds ids so key names stay short and predictable.
const maxIDLen = 128

// ValidID reports whether s may be used as a key, lease, provider or pool id:
// [A-Za-z0-9][A-Za-z0-9._-]{0,127}. Such ids can never break a hash tag or a
// key name, whatever the backend.
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > maxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			return false
		}
	}
	return true
}

// checkIDs returns an ErrInvalid naming the first malformed id. names and
// values alternate: checkIDs("key id", k, "pool", p).
func checkIDs(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if !ValidID(pairs[i+1]) {
			return invalidf("%s %q: want 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit", pairs[i], pairs[i+1])
		}
	}
	return nil
}

// Schema names the Redis keys under one prefix (DESIGN.md, "Redis key
// schema"). Every key of one credential carries the hash tag {<key id>}, so
// each transaction touches one slot. Every Redis-backed store uses it.
type Schema struct{ Prefix string }

// Pool is the ZSET of key ids of one provider/pool (ops score, never read by
// Allocate).
func (s Schema) Pool(provider, pool string) string {
	return s.Prefix + ":pool:{" + provider + "/" + pool + "}"
}

// Key is the HASH with the credential's allocation state.
func (s Schema) Key(keyID string) string { return s.Prefix + ":key:{" + keyID + "}" }

// Leases is the ZSET of the key's leases, scored by expiry in ms.
func (s Schema) Leases(keyID string) string { return s.Key(keyID) + ":leases" }

// Lease is the HASH recording who a lease belongs to.
func (s Schema) Lease(keyID, leaseID string) string {
	return s.Key(keyID) + ":lease:" + leaseID
}

// CheckKeyIDs returns an ErrInvalid naming the first malformed key id.
func CheckKeyIDs(ids ...string) error {
	for _, id := range ids {
		if err := checkIDs("key id", id); err != nil {
			return err
		}
	}
	return nil
}

// CheckTTL returns an ErrInvalid for a lease ttl under one millisecond, the
// stores' clock resolution.
func CheckTTL(ttl time.Duration) error {
	if ttl < time.Millisecond {
		return invalidf("lease ttl %v: want at least 1ms", ttl)
	}
	return nil
}

// validPrefix rejects prefixes that would put a brace before the hash tag.
func validPrefix(p string) bool {
	return p != "" && !strings.ContainsAny(p, "{}")
}
