package catalog

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/sqlitex/sqlitextest"
	"github.com/credpool/credpool/optimistic"
)

// Writes prune the generation log and the tombstones to the last keep
// generations; a cache that fell further behind reloads everything, and a
// key deleted while it was away is gone from it.
func TestHistoryIsPruned(t *testing.T) {
	db := sqlitextest.Temp(t)
	c, err := New(t.Context(), db, nil)
	require.NoError(t, err)
	c.history = history{keep: 8, pruneEvery: 4}
	k := Key{
		ID: "gone", Provider: "openai", Pool: "default", Models: []string{"gpt-4o"},
		Secret: "sk", Status: optimistic.StatusAvailable, MaxConcurrentUses: 1,
	}
	_, err = c.Put(t.Context(), k)
	require.NoError(t, err)
	cache, err := NewCache(t.Context(), c, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cache.Close(t.Context()) })

	require.NoError(t, c.Delete(t.Context(), "gone"))
	for i := range 20 {
		k.ID = fmt.Sprintf("k%d", i)
		_, err = c.Put(t.Context(), k)
		require.NoError(t, err)
	}
	var logged, tombstones int
	require.NoError(t, db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM catalog_generations`).Scan(&logged))
	require.NoError(t, db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM catalog_tombstones`).Scan(&tombstones))
	require.LessOrEqual(t, logged, 8+4, "pruned to keep, plus what came since the last pruning")
	require.Zero(t, tombstones, "the delete's tombstone is older than keep")

	_, err = cache.Key(t.Context(), "gone")
	require.ErrorIs(t, err, ErrNotFound, "reloaded whole: the log no longer has the cache's generation")
	keys, err := cache.List(t.Context(), "", "")
	require.NoError(t, err)
	require.Len(t, keys, 20)
}
