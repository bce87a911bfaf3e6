package optimistic

import (
	"strconv"
	"time"
)

// The rules every LeaseStore applies, so that stores agree on what an id
// is, what a stored limit or cooldown means, and when a key frees up.

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
			// The value is not quoted: a caller may have put a secret there.
			return invalidf("%s: want 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit", pairs[i])
		}
	}
	return nil
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

// ParseLimit interprets a stored max_concurrent_uses: missing, malformed or
// below 1 means 1 (the conservative reading of a bad config).
func ParseLimit(raw string) int {
	n, err := strconv.Atoi(raw)
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// Usable reports whether a key may take a lease at now (ms): available, or
// rate_limited/cooldown with a cooldown_until (ms) that has passed. An empty
// or malformed cooldown_until keeps a limited key unusable, since nothing
// says when it recovers.
func Usable(status Status, cooldownUntil string, now int64) bool {
	switch status {
	case StatusAvailable:
		return true
	case StatusRateLimited, StatusCooldown:
		cd, ok := parseMillis(cooldownUntil)
		return ok && cd <= now
	}
	return false
}

// FreeAt is the earliest moment (ms) an existing key can grant, the rule
// every store reports in CapacityError.FreeAt and KeyInfo.FreeAt: now if it
// can grant now; else the end of its cooldown or its first live lease
// expiry (first, 0 if none), whichever is later; 0 if it never frees up by
// itself (disabled, pending, exhausted, or cooling with no end). held says
// that moment is when a held lease ends, as CapacityError.Held.
func FreeAt(status Status, cooldownUntil string, limit, live int, first, now int64) (at int64, held bool) {
	full := int64(0)
	if live >= limit {
		full = first
	}
	switch {
	case Usable(status, cooldownUntil, now):
		at = max(now, full)
	case status != StatusRateLimited && status != StatusCooldown:
		return 0, false
	default:
		cd, ok := parseMillis(cooldownUntil)
		if !ok {
			return 0, false
		}
		at = max(cd, full)
	}
	return at, full != 0 && at == full
}

// NextFence is the fencing token a grant at now (the store's clock) hands
// out after last, the key's previous one: the clock in microseconds, or one
// more than last if that is not higher (two grants in one microsecond, or a
// clock that went back). The clock part makes tokens survive what a
// counter does not: a store that lost the key (a restart without
// persistence, a flush) or a DeleteKey starts again above every token it
// gave before, as long as its clock has not gone back meanwhile. Tokens
// stay below 2^53, exact in JSON and in Lua, until the year 2255.
func NextFence(last int64, now time.Time) int64 { return max(last+1, now.UnixMicro()) }

func parseMillis(s string) (int64, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}
