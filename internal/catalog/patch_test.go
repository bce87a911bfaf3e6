package catalog_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/postgres"
	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/test/pgtest"
)

// Update changes what it is given and nothing else: the secret (sealed,
// as stored) and the counters a cache wrote behind stay, and every
// instance's cache sees the change.
func TestUpdateChangesOnlyWhatItIsGiven(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, &catalog.Options{Sealer: sealer(t, key32(1))})
		other := newCache(t, db.open(t, &catalog.Options{Sealer: sealer(t, key32(1))}), nil)
		k := testKey("k")
		k.Successes, k.LastVerifiedAt = 7, time.UnixMilli(1_700_000_000_000).UTC()
		before := put(t, c, k)
		ctx := t.Context()

		// A use written behind by another instance, between the put and
		// the update.
		other.MarkUsed("k", time.UnixMilli(1_800_000_000_000))
		_, err := other.Report(ctx, "k", "l1", catalog.OutcomeSuccess, 0, time.Now())
		require.NoError(t, err)
		require.NoError(t, other.Flush(ctx))

		disabled := optimistic.StatusDisabled
		got, err := c.Update(ctx, "k", catalog.Patch{Status: &disabled})
		require.NoError(t, err)
		require.Equal(t, optimistic.StatusDisabled, got.Status)
		require.Empty(t, got.Secret, "returned without its secret")
		after := get(t, c, "k")
		require.Equal(t, catalog.Secret(secret), after.Secret, "the sealed secret is written back as it was")
		require.Equal(t, int64(8), after.Successes, "the counter flushed meanwhile is kept")
		require.Equal(t, time.UnixMilli(1_800_000_000_000).UTC(), after.LastUsedAt)
		require.Equal(t, before.LastVerifiedAt, after.LastVerifiedAt)
		require.Equal(t, before.CreatedAt, after.CreatedAt)
		require.Equal(t, before.Models, after.Models)
		require.Equal(t, before.MaxConcurrentUses, after.MaxConcurrentUses)

		seen, err := other.Key(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, optimistic.StatusDisabled, seen.Status, "another instance's cache sees it")

		limit, pool := 5, "vip"
		until := time.Now().Add(time.Hour).Truncate(time.Millisecond).UTC()
		cooldown := optimistic.StatusCooldown
		got, err = c.Update(ctx, "k", catalog.Patch{
			Pool: &pool, Models: []string{"m2", "m1", "m2"}, MaxConcurrentUses: &limit,
			Status: &cooldown, CooldownUntil: &until,
		})
		require.NoError(t, err)
		require.Equal(t, "vip", got.Pool)
		require.Equal(t, []string{"m1", "m2"}, got.Models)
		require.Equal(t, 5, got.MaxConcurrentUses)
		require.Equal(t, until, got.CooldownUntil.UTC())

		available := optimistic.StatusAvailable
		got, err = c.Update(ctx, "k", catalog.Patch{Status: &available})
		require.NoError(t, err)
		require.True(t, got.CooldownUntil.IsZero(), "a status given without its cooldown clears it")
		require.Equal(t, "vip", got.Pool, "kept")
	})
}

func TestUpdateRefuses(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, nil)
		before := put(t, c, testKey("k"))
		zero, bogus, available := 0, optimistic.Status("bogus"), optimistic.StatusAvailable
		until := time.Now().Add(time.Hour)
		blank := "bad pool"
		for _, tt := range []struct {
			name  string
			p     catalog.Patch
			field string
		}{
			{"nothing to change", catalog.Patch{}, "want a field"},
			{"cooldown without a status", catalog.Patch{CooldownUntil: &until}, "cooldown_until"},
			{"cooldown of an available key", catalog.Patch{Status: &available, CooldownUntil: &until}, "cooldown_until"},
			{"limit 0", catalog.Patch{MaxConcurrentUses: &zero}, "max_concurrent_uses"},
			{"unknown status", catalog.Patch{Status: &bogus}, "status"},
			{"no models", catalog.Patch{Models: []string{}}, "models"},
			{"bad model", catalog.Patch{Models: []string{"a b"}}, "model"},
			{"bad pool", catalog.Patch{Pool: &blank}, "pool"},
		} {
			_, err := c.Update(t.Context(), "k", tt.p)
			require.ErrorIs(t, err, optimistic.ErrInvalid, tt.name)
			require.ErrorContains(t, err, tt.field, tt.name)
		}
		require.Equal(t, before, noSecret(get(t, c, "k")), "nothing changed")

		disabled := optimistic.StatusDisabled
		_, err := c.Update(t.Context(), "nope", catalog.Patch{Status: &disabled})
		require.ErrorIs(t, err, catalog.ErrNotFound)
	})
}

// On PostgreSQL (READ COMMITTED) a count and use time flushed between
// Update's read of the key and its write are kept: the write does not
// put back the ones it read. The flush here is a transaction of the test's holding
// the row; Update's write waits for it, then commits after it.
func TestUpdateKeepsACountFlushedMeanwhile(t *testing.T) {
	url := pgtest.URL(t)
	db, err := postgres.Open(t.Context(), url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	c, err := catalog.NewPostgres(t.Context(), db, nil)
	require.NoError(t, err)
	k := testKey("k")
	k.Successes, k.LastUsedAt = 7, time.UnixMilli(1_700_000_000_000)
	put(t, c, k)

	flush, err := db.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	defer func() { _ = flush.Rollback() }()
	_, err = flush.ExecContext(t.Context(), `UPDATE catalog_keys SET successes = successes + 1, last_used_at = 1800000000000 WHERE id = 'k'`)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		disabled := optimistic.StatusDisabled
		_, err := c.Update(context.Background(), "k", catalog.Patch{Status: &disabled})
		done <- err
	}()
	// Update has read the key and waits for the row.
	require.Eventually(t, func() bool {
		var waiting int
		err := db.QueryRowContext(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO catalog_keys%'`).Scan(&waiting)
		require.NoError(t, err)
		return waiting == 1
	}, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, flush.Commit())
	require.NoError(t, <-done)

	after := get(t, c, "k")
	require.Equal(t, optimistic.StatusDisabled, after.Status)
	require.Equal(t, int64(8), after.Successes)
	require.Equal(t, time.UnixMilli(1_800_000_000_000).UTC(), after.LastUsedAt, "nor is the use time put back")
}
