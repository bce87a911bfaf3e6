package optimistic

import (
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Field names of the key HASH and the lease record HASH.
const (
	fieldProvider = "provider"
	fieldPool     = "pool"
	fieldStatus   = "status"
	fieldCooldown = "cooldown_until"
	fieldLimit    = "max_concurrent_uses"
	fieldLastUsed = "last_used_at"
	fieldFence    = "fence"
	fieldKeyID    = "key_id"
	fieldUntil    = "lease_until"
)

// keyFields are the key HASH fields every read takes, in parseKey's order.
var keyFields = []string{fieldProvider, fieldPool, fieldStatus, fieldCooldown, fieldLimit, fieldFence}

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

func parseMillis(s string) (int64, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// keyState is one read of a key HASH.
type keyState struct {
	exists   bool
	provider string
	pool     string
	status   Status
	cooldown string
	limit    int
	fence    int64
}

// parseKey reads an HMGET of keyFields; a missing provider means no key.
func parseKey(vals []any) keyState {
	str := func(i int) string {
		if i < len(vals) {
			if s, ok := vals[i].(string); ok {
				return s
			}
		}
		return ""
	}
	fence, _ := strconv.ParseInt(str(5), 10, 64)
	return keyState{
		exists:   str(0) != "",
		provider: str(0),
		pool:     str(1),
		status:   Status(str(2)),
		cooldown: str(3),
		limit:    ParseLimit(str(4)),
		fence:    fence,
	}
}

func (k keyState) member(provider, pool string) bool {
	return k.exists && k.provider == provider && k.pool == pool
}

// leaseSet is one read of a key's lease ZSET at now.
type leaseSet struct {
	expired []string // lease ids whose expiry has passed, to prune
	live    int
	first   int64 // earliest live expiry (ms), 0 if none
}

// splitLeases sorts a ZRANGE WITHSCORES (ascending expiry) into expired and
// live leases. A lease expiring exactly at now is expired.
func splitLeases(zs []redis.Z, now int64) leaseSet {
	var s leaseSet
	for _, z := range zs {
		exp := int64(z.Score)
		if exp <= now {
			s.expired = append(s.expired, z.Member.(string))
			continue
		}
		if s.live == 0 {
			s.first = exp
		}
		s.live++
	}
	return s
}

// freeAt applies FreeAt to one read of a key and its leases.
func freeAt(k keyState, l leaseSet, now int64) int64 {
	if !k.exists {
		return 0
	}
	return FreeAt(k.status, k.cooldown, k.limit, l.live, l.first, now)
}

// FreeAt is the earliest moment (ms) an existing key can grant, the rule
// every store reports in CapacityError.FreeAt and KeyInfo.FreeAt: now if it
// can grant now; else the end of its cooldown or its first live lease
// expiry (first, 0 if none), whichever is later; 0 if it never frees up by
// itself (disabled, pending, exhausted, or cooling with no end).
func FreeAt(status Status, cooldownUntil string, limit, live int, first, now int64) int64 {
	full := int64(0)
	if live >= limit {
		full = first
	}
	if Usable(status, cooldownUntil, now) {
		return max(now, full)
	}
	if status != StatusRateLimited && status != StatusCooldown {
		return 0
	}
	cd, ok := parseMillis(cooldownUntil)
	if !ok {
		return 0
	}
	return max(cd, full)
}

// liveScore returns the expiry of lease id if it is in zs and unexpired.
func liveScore(zs []redis.Z, id string, now int64) (int64, bool) {
	for _, z := range zs {
		if z.Member == id && int64(z.Score) > now {
			return int64(z.Score), true
		}
	}
	return 0, false
}

// fromMillis converts ms since the epoch; 0 stays the zero Time.
func fromMillis(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// earliest returns the earlier of two ms instants, ignoring 0 (none).
func earliest(a, b int64) int64 {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}
