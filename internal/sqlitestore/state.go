package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"strconv"

	"github.com/credpool/credpool/optimistic"
)

// keyState is one read of a key and its live leases at now.
type keyState struct {
	exists   bool
	provider string
	pool     string
	status   optimistic.Status
	cooldown string // raw cooldown_until, as optimistic.Usable reads it
	limit    int
	fence    int64
	live     int
	first    int64 // earliest live lease expiry (ms), 0 if none
}

// readKey reads key id and counts its leases that are live at now.
func readKey(ctx context.Context, tx *sql.Tx, id string, now int64) (keyState, error) {
	var (
		k               keyState
		status          string
		cooldown, limit sql.NullString
	)
	err := tx.QueryRowContext(ctx, `
SELECT k.provider, k.pool, k.status, k.cooldown_until, k.max_concurrent_uses, k.fence,
       count(l.id), coalesce(min(l.until), 0)
FROM lease_keys k LEFT JOIN lease_leases l ON l.key_id = k.id AND l.until > ?
WHERE k.id = ?
GROUP BY k.id`, now, id).Scan(
		&k.provider, &k.pool, &status, &cooldown, &limit, &k.fence, &k.live, &k.first)
	if errors.Is(err, sql.ErrNoRows) {
		// KeyInfo.Limit is at least 1, even for a missing key.
		return keyState{limit: 1}, nil
	}
	if err != nil {
		return keyState{}, err
	}
	k.exists = true
	k.status = optimistic.Status(status)
	k.cooldown = cooldown.String
	k.limit = optimistic.ParseLimit(limit.String)
	return k, nil
}

func (k keyState) member(provider, pool string) bool {
	return k.exists && k.provider == provider && k.pool == pool
}

// canGrant reports whether the key takes one more lease at now.
func (k keyState) canGrant(now int64) bool {
	return optimistic.Usable(k.status, k.cooldown, now) && k.live < k.limit
}

// freeAt is the earliest moment (ms) the key can grant: now if it can grant
// now, 0 if it never frees up by itself (optimistic.FreeAt).
func (k keyState) freeAt(now int64) int64 {
	if !k.exists {
		return 0
	}
	at, _ := optimistic.FreeAt(k.status, k.cooldown, k.limit, k.live, k.first, now)
	return at
}

// cooldownUntil is the parsed cooldown_until, zero if unset or malformed.
func (k keyState) cooldownUntil() int64 {
	cd, _ := strconv.ParseInt(k.cooldown, 10, 64)
	return cd
}
