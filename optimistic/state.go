package optimistic

import (
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	rs "github.com/credpool/credpool/internal/redisschema"
)

// keyFields are the key HASH fields every read takes, in parseKey's order.
var keyFields = []string{rs.FieldProvider, rs.FieldPool, rs.FieldStatus, rs.FieldCooldown, rs.FieldLimit, rs.FieldFence, rs.FieldLastUsed, rs.FieldHeld, rs.FieldSeq}

// keyState is one read of a key HASH.
type keyState struct {
	exists   bool
	provider string
	pool     string
	status   Status
	cooldown string
	limit    int
	fence    int64
	lastUsed int64 // ms, 0 if never granted
	held     int64 // ms: no grant before (see Options.LostHold), 0 if none
	seq      int64 // the grants' count (see lost.go)
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
	lastUsed, _ := strconv.ParseInt(str(6), 10, 64)
	held, _ := strconv.ParseInt(str(7), 10, 64)
	seq, _ := strconv.ParseInt(str(8), 10, 64)
	return keyState{
		exists:   str(0) != "",
		provider: str(0),
		pool:     str(1),
		status:   Status(str(2)),
		cooldown: str(3),
		limit:    ParseLimit(str(4)),
		fence:    fence,
		lastUsed: lastUsed,
		held:     held,
		seq:      seq,
	}
}

// usable reports whether the key may take a lease at now (ms): Usable, and
// not held back after a loss.
func (k keyState) usable(now int64) bool {
	return Usable(k.status, k.cooldown, now) && k.held <= now
}

// behind reports whether the key's state is older than seen, a grant
// count this process saw granted or read on it: the store came back from
// an older copy and forgot the grants since (see lost.go). A HASH whose
// count did not start from the clock is never behind: every HASH a store
// makes starts one (SyncKey), and so does its next grant, so only one
// from an older release has none, or a count from zero that a handoff's
// HINCRBY made on a HASH without one.
func (k keyState) behind(seen int64) bool {
	return k.exists && k.seq >= minClockSeq && k.seq < seen
}

// minClockSeq is the least count started from the clock (µs, in 2001): a
// count below it started from zero.
const minClockSeq = 1_000_000_000_000_000

// nextSeq is the count after n more grants on a key whose count is last,
// read at now: one that did not start from the clock starts there.
func nextSeq(last, n int64, now time.Time) int64 {
	if last < minClockSeq {
		last = now.UnixMicro()
	}
	return last + n
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
func freeAt(k keyState, l leaseSet, now int64) (at int64, held bool) {
	if !k.exists {
		return 0, false
	}
	at, held = FreeAt(k.status, k.cooldown, k.limit, l.live, l.first, now)
	if at != 0 && k.held > at {
		return k.held, false
	}
	return at, held
}

// liveScore returns the expiry of member if it is in zs and unexpired.
func liveScore(zs []redis.Z, member string, now int64) (int64, bool) {
	for _, z := range zs {
		if z.Member == member && int64(z.Score) > now {
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
