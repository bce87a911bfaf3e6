package sqlitestore

import (
	"context"
	"database/sql"

	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
)

// SyncKey upserts a key's allocation state; its provider and pool columns are
// its pool membership. Leases, the fencing counter and a stored
// last_used_at are kept: k.LastUsedAt only fills in a missing one. On error
// nothing is written.
func (s *Store) SyncKey(ctx context.Context, k optimistic.KeyState) error {
	return s.SyncKeys(ctx, k)
}

// SyncKeys is SyncKey for every key of keys in one transaction, so one
// write to disk however many: every key is checked first, and on error
// none is written.
func (s *Store) SyncKeys(ctx context.Context, keys ...optimistic.KeyState) error {
	if len(keys) == 0 {
		return nil
	}
	for _, k := range keys {
		if err := k.Validate(); err != nil {
			return err
		}
	}
	_, err := s.do(ctx, false, func(tx *sql.Tx, _ int64) error {
		upsert := s.on(ctx, tx, qUpsertKey)
		for _, k := range keys {
			if _, err := upsert.ExecContext(ctx, k.ID, k.Provider, k.Pool, string(k.Status), toMillis(k.CooldownUntil),
				k.MaxConcurrentUses, toMillis(k.LastUsedAt), k.Score); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		// A limit raised or a key made usable may free several slots.
		for _, k := range keys {
			s.queue.WakeAll(k.ID)
		}
	}
	return sqlitex.Classify(ctx, "sync keys", err)
}

// DeleteKey removes the key, its pool membership and all its leases, whose
// holders lose them; its fencing counter restarts if it is synced again.
// Deleting a missing key is not an error. On error nothing is removed.
func (s *Store) DeleteKey(ctx context.Context, keyID string) error {
	if err := optimistic.CheckKeyIDs(keyID); err != nil {
		return err
	}
	_, err := s.do(ctx, false, func(tx *sql.Tx, _ int64) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM lease_leases WHERE key_id = ?`, keyID); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM lease_keys WHERE id = ?`, keyID)
		return err
	})
	return sqlitex.Classify(ctx, "delete key", err)
}

// ClearLeases force-releases every lease of the key (an admin action) and
// returns how many there were, expired ones included. Their holders lose
// them. On error nothing is removed.
func (s *Store) ClearLeases(ctx context.Context, keyID string) (int, error) {
	if err := optimistic.CheckKeyIDs(keyID); err != nil {
		return 0, err
	}
	var n int64
	_, err := s.do(ctx, false, func(tx *sql.Tx, _ int64) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM lease_leases WHERE key_id = ?`, keyID)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, sqlitex.Classify(ctx, "clear leases", err)
	}
	for range n {
		s.queue.Wake(keyID)
	}
	return int(n), nil
}

// Inspect reads the live state of every key in one query, in one read
// transaction. Missing keys come back with Exists false.
func (s *Store) Inspect(ctx context.Context, keyIDs ...string) ([]optimistic.KeyInfo, error) {
	if err := optimistic.CheckKeyIDs(keyIDs...); err != nil {
		return nil, err
	}
	var out []optimistic.KeyInfo
	_, err := s.do(ctx, true, func(tx *sql.Tx, now int64) error {
		keys, err := s.readKeys(ctx, tx, keyIDs, now)
		if err != nil {
			return err
		}
		out = make([]optimistic.KeyInfo, len(keys))
		for i, k := range keys {
			out[i] = optimistic.KeyInfo{
				ID: keyIDs[i], Exists: k.exists, Provider: k.provider, Pool: k.pool, Status: k.status,
				CooldownUntil: fromMillis(k.cooldownUntil()), Limit: k.limit, Live: k.live,
				FreeAt: fromMillis(k.freeAt(now)), Fence: k.fence, LastUsedAt: fromMillis(k.lastUsed),
			}
		}
		return nil
	})
	if err != nil {
		return nil, sqlitex.Classify(ctx, "inspect", err)
	}
	return out, nil
}
