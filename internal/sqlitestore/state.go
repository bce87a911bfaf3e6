package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
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
	lastUsed int64 // ms, 0 if never granted nor seeded
	live     int
	first    int64 // earliest live lease expiry (ms), 0 if none
}

// readKeys reads the keys named by ids, one state for each id in their
// order, with their leases live at now, in one query whatever the number.
func (s *Store) readKeys(ctx context.Context, tx *sql.Tx, ids []string, now int64) ([]keyState, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	list, err := json.Marshal(ids)
	if err != nil {
		return nil, err
	}
	rows, err := s.on(ctx, tx, qReadKeys).QueryContext(ctx, string(list), now)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]keyState, 0, len(ids))
	for rows.Next() {
		var (
			k                                       keyState
			provider, pool, status, cooldown, limit sql.NullString
			fence, lastUsed                         sql.NullInt64
		)
		err := rows.Scan(&k.exists, &provider, &pool, &status, &cooldown, &limit,
			&fence, &lastUsed, &k.live, &k.first)
		if err != nil {
			return nil, err
		}
		k.provider, k.pool, k.status = provider.String, pool.String, optimistic.Status(status.String)
		k.cooldown, k.fence, k.lastUsed = cooldown.String, fence.Int64, lastUsed.Int64
		// KeyInfo.Limit is at least 1, even for a missing key.
		k.limit = optimistic.ParseLimit(limit.String)
		out = append(out, k)
	}
	return out, rows.Err()
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
