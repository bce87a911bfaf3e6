package optimistic

import (
	"strings"
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

// schema names the Redis keys of one store. Every key of one credential
// carries the hash tag {<key id>}, so each transaction touches one slot.
type schema struct{ prefix string }

// pool is the ZSET of key ids of one provider/pool (ops score, never read by
// Allocate).
func (s schema) pool(provider, pool string) string {
	return s.prefix + ":pool:{" + provider + "/" + pool + "}"
}

// key is the HASH with the credential's allocation state.
func (s schema) key(keyID string) string { return s.prefix + ":key:{" + keyID + "}" }

// leases is the ZSET of the key's leases, scored by expiry in ms.
func (s schema) leases(keyID string) string { return s.key(keyID) + ":leases" }

// lease is the HASH recording who a lease belongs to.
func (s schema) lease(keyID, leaseID string) string {
	return s.key(keyID) + ":lease:" + leaseID
}

// validPrefix rejects prefixes that would put a brace before the hash tag.
func validPrefix(p string) bool {
	return p != "" && !strings.ContainsAny(p, "{}")
}
