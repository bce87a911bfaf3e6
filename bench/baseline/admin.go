package baseline

import (
	"context"

	rs "github.com/credpool/credpool/internal/redisschema"
	"github.com/credpool/credpool/optimistic"
)

// DeleteKey removes the key HASH, its lease ZSET, every lease record and its
// pool membership. Holders of its leases lose them. Deleting a missing key is
// not an error. The pool membership goes first, then one run of drop.lua
// removes the rest; if that fails, the key is still there and deleting again
// finishes the job.
func (s *Store) DeleteKey(ctx context.Context, keyID string) error {
	if err := optimistic.CheckKeyIDs(keyID); err != nil {
		return err
	}
	owner, err := s.rdb.HMGet(ctx, s.keys.Key(keyID), rs.FieldProvider, rs.FieldPool).Result()
	if err != nil {
		return optimistic.Classify(ctx, "delete key", err)
	}
	if provider, _ := owner[0].(string); provider != "" {
		pool, _ := owner[1].(string)
		if err := s.rdb.ZRem(ctx, s.keys.Pool(provider, pool), keyID).Err(); err != nil {
			return optimistic.Classify(ctx, "delete key", err)
		}
	}
	_, err = s.drop(ctx, keyID, true)
	return optimistic.Classify(ctx, "delete key", err)
}

// ClearLeases force-releases every lease of the key (an admin action) and
// returns how many there were, expired ones included. Their holders lose
// them. It is one run of drop.lua, so other clients see all of them gone or
// none.
func (s *Store) ClearLeases(ctx context.Context, keyID string) (int, error) {
	if err := optimistic.CheckKeyIDs(keyID); err != nil {
		return 0, err
	}
	n, err := s.drop(ctx, keyID, false)
	if err != nil {
		return 0, optimistic.Classify(ctx, "clear leases", err)
	}
	return n, nil
}

// drop runs drop.lua on the key's leases, and on its HASH when withKey.
func (s *Store) drop(ctx context.Context, keyID string, withKey bool) (int, error) {
	keys := []string{s.keys.Leases(keyID)}
	if withKey {
		keys = append(keys, s.keys.Key(keyID))
	}
	return dropScript.Run(ctx, s.rdb, keys, s.keys.Lease(keyID, "")).Int()
}
