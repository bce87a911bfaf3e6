package catalog_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/pgproc"
	"github.com/credpool/credpool/internal/postgres"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
	"github.com/credpool/credpool/test/pgtest"
)

func TestPutGet(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, nil)
		cooldown := time.UnixMilli(1_900_000_000_123).Add(456 * time.Microsecond)
		k := testKey("k1")
		k.Models = []string{"gpt-4o-mini", "gpt-4o", "gpt-4o-mini"}
		k.Status = optimistic.StatusCooldown
		k.CooldownUntil = cooldown

		before := time.Now().Truncate(time.Millisecond)
		stored := put(t, c, k)
		require.Equal(t, []string{"gpt-4o", "gpt-4o-mini"}, stored.Models)
		require.Equal(t, time.UnixMilli(1_900_000_000_123).UTC(), stored.CooldownUntil)
		require.True(t, stored.LastUsedAt.IsZero())
		require.True(t, stored.LastVerifiedAt.IsZero())
		require.False(t, stored.CreatedAt.Before(before))
		require.Equal(t, stored.CreatedAt, stored.UpdatedAt)

		got := get(t, c, "k1")
		require.Equal(t, stored, noSecret(got))
		require.Empty(t, stored.Secret.Reveal(), "only Get reads a secret")
		require.Equal(t, secret, got.Secret.Reveal())
		require.Equal(t, optimistic.StatusCooldown, got.Status)
		require.Equal(t, 2, got.MaxConcurrentUses)
		require.True(t, got.Supports("gpt-4o-mini"))
	})
}

func TestPutKeepsHistory(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, nil)
		k := testKey("k1")
		k.CreatedAt = time.UnixMilli(1_000_000).UTC()
		put(t, c, k)
		now := time.Now()
		_, err := c.Report(t.Context(), "k1", uuid.NewString(), catalog.OutcomeSuccess, 0, now)
		require.NoError(t, err)
		_, err = c.Report(t.Context(), "k1", uuid.NewString(), catalog.OutcomeError, 0, now)
		require.NoError(t, err)
		_, err = c.Report(t.Context(), "k1", uuid.NewString(), catalog.OutcomeRateLimited, time.Second, now)
		require.NoError(t, err)
		cc := newCache(t, c, nil)
		cc.MarkUsed("k1", now)
		require.NoError(t, cc.Flush(t.Context()))

		// An admin upsert with zero history changes the config and keeps the rest.
		k = testKey("k1")
		k.Pool = "vip"
		k.Models = []string{"o1"}
		k.Secret = "sk-rotated"
		k.MaxConcurrentUses = 5
		got := put(t, c, k)
		require.Equal(t, "vip", got.Pool)
		require.Equal(t, []string{"o1"}, got.Models)
		require.Equal(t, "sk-rotated", get(t, c, "k1").Secret.Reveal())
		require.Equal(t, 5, got.MaxConcurrentUses)
		require.Equal(t, optimistic.StatusAvailable, got.Status)
		require.True(t, got.CooldownUntil.IsZero(), "cooldown comes from the upsert")
		require.Equal(t, int64(1), got.Successes)
		require.Equal(t, int64(1), got.Errors)
		require.Equal(t, int64(1), got.RateLimitHits)
		require.Equal(t, now.UnixMilli(), got.LastUsedAt.UnixMilli())
		require.Equal(t, time.UnixMilli(1_000_000).UTC(), got.CreatedAt)
		require.False(t, got.UpdatedAt.Before(now.Truncate(time.Millisecond)))

		// Non-zero history in the upsert wins.
		verified := time.UnixMilli(2_000_000).UTC()
		k.Successes, k.Errors, k.RateLimitHits = 10, 20, 30
		k.LastUsedAt, k.LastVerifiedAt, k.CreatedAt = verified, verified, verified
		got = put(t, c, k)
		require.Equal(t, []int64{10, 20, 30}, []int64{got.Successes, got.Errors, got.RateLimitHits})
		require.Equal(t, verified, got.LastUsedAt)
		require.Equal(t, verified, got.LastVerifiedAt)
		require.Equal(t, verified, got.CreatedAt)
	})
}

// PutMany checks every key before it writes any: one bad key writes
// nothing and is named.
func TestPutMany(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, nil)
		bad := testKey("k3")
		bad.MaxConcurrentUses = 0
		_, err := c.PutMany(t.Context(), testKey("k1"), testKey("k2"), bad)
		require.ErrorIs(t, err, optimistic.ErrInvalid)
		require.ErrorContains(t, err, `"k3"`)
		keys, err := c.List(t.Context(), "", "")
		require.NoError(t, err)
		require.Empty(t, keys, "nothing written")

		stored, err := c.PutMany(t.Context(), testKey("k1"), testKey("k2"))
		require.NoError(t, err)
		require.Len(t, stored, 2)
		require.Equal(t, "k2", stored[1].ID)
		require.Equal(t, secret, get(t, c, "k2").Secret.Reveal())
	})
}

func TestPutValidation(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		tests := []struct {
			name  string
			edit  func(*catalog.Key)
			field string
		}{
			{"empty id", func(k *catalog.Key) { k.ID = "" }, "key id"},
			{"id with brace", func(k *catalog.Key) { k.ID = "a{b}" }, "key id"},
			{"provider", func(k *catalog.Key) { k.Provider = "open ai" }, "provider"},
			{"pool", func(k *catalog.Key) { k.Pool = "-vip" }, "pool"},
			{"status", func(k *catalog.Key) { k.Status = "broken" }, "status"},
			{"no models", func(k *catalog.Key) { k.Models = nil }, "models"},
			{"empty model", func(k *catalog.Key) { k.Models = []string{"gpt-4o", ""} }, "model"},
			{"padded model", func(k *catalog.Key) { k.Models = []string{" gpt-4o"} }, "model"},
			{"a list for a model", func(k *catalog.Key) { k.Models = []string{"gpt-4o,gpt-4o-mini"} }, "model"},
			{"no secret", func(k *catalog.Key) { k.Secret = "" }, "secret"},
			{"a blank secret", func(k *catalog.Key) { k.Secret = " \t" }, "secret"},
			{"zero limit", func(k *catalog.Key) { k.MaxConcurrentUses = 0 }, "max_concurrent_uses"},
			{"negative successes", func(k *catalog.Key) { k.Successes = -1 }, "successes"},
			{"negative errors", func(k *catalog.Key) { k.Errors = -1 }, "errors"},
			{"negative rate limit hits", func(k *catalog.Key) { k.RateLimitHits = -1 }, "rate_limit_hits"},
		}
		c := db.open(t, nil)
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				k := testKey("k1")
				tt.edit(&k)
				_, err := c.Put(t.Context(), k)
				require.ErrorIs(t, err, optimistic.ErrInvalid)
				require.Contains(t, err.Error(), tt.field)
				require.NotContains(t, err.Error(), secret)
			})
		}
		_, err := c.Get(t.Context(), "k1")
		require.ErrorIs(t, err, catalog.ErrNotFound, "a rejected key is not written")
	})
}

func TestList(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, nil)
		keys := []catalog.Key{testKey("c"), testKey("a"), testKey("b"), testKey("d")}
		keys[1].Pool = "vip"
		keys[2].Models = []string{"gpt-4o", "o1"}
		keys[3].Provider = "anthropic"
		keys[3].Models = []string{"claude-sonnet-4"}
		for _, k := range keys {
			put(t, c, k)
		}
		ids := func(keys []catalog.Key) []string {
			var out []string
			for _, k := range keys {
				out = append(out, k.ID)
			}
			return out
		}

		tests := []struct {
			provider, pool string
			want           []string
		}{
			{"", "", []string{"a", "b", "c", "d"}},
			{"openai", "", []string{"a", "b", "c"}},
			{"openai", "default", []string{"b", "c"}},
			{"", "default", []string{"b", "c", "d"}},
			{"openai", "gold", nil},
			{"mistral", "", nil},
		}
		for _, tt := range tests {
			got, err := c.List(t.Context(), tt.provider, tt.pool)
			require.NoError(t, err)
			require.Equal(t, tt.want, ids(got), "List(%q, %q)", tt.provider, tt.pool)
		}

		all, err := c.List(t.Context(), "", "")
		require.NoError(t, err)
		require.Equal(t, []string{"gpt-4o", "o1"}, all[1].Models)
		for _, k := range all {
			require.Empty(t, k.Secret.Reveal(), "List never reads a secret: %s", k.ID)
		}
		require.Equal(t, secret, get(t, c, "b").Secret.Reveal(), "Get does")
	})
}

// Delete removes the key's models too: with SQLite's foreign keys off
// (the plain opener) as well as on, and on PostgreSQL.
func TestDelete(t *testing.T) {
	for name, open := range openers {
		t.Run(name, func(t *testing.T) {
			db := open(t, filepath.Join(t.TempDir(), "credpool.db"))
			c, err := catalog.New(t.Context(), db, nil)
			require.NoError(t, err)
			checkDelete(t, c, db.DB)
		})
	}
	t.Run("postgres", func(t *testing.T) {
		db := pgtest.Open(t)
		c, err := catalog.NewPostgres(t.Context(), db, nil)
		require.NoError(t, err)
		checkDelete(t, c, db.DB)
	})
}

func checkDelete(t *testing.T, c *catalog.SQL, db *sql.DB) {
	t.Helper()
	put(t, c, testKey("k1"))
	put(t, c, testKey("k2"))

	require.NoError(t, c.Delete(t.Context(), "k1"))
	_, err := c.Get(t.Context(), "k1")
	require.ErrorIs(t, err, catalog.ErrNotFound)
	var models int
	require.NoError(t, db.QueryRowContext(t.Context(),
		`SELECT COUNT(*) FROM catalog_key_models WHERE key_id = 'k1'`).Scan(&models))
	require.Zero(t, models)
	require.Equal(t, "k2", get(t, c, "k2").ID)

	err = c.Delete(t.Context(), "k1")
	require.ErrorIs(t, err, catalog.ErrNotFound)
}

func TestNotFound(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, nil)
		now := time.Now()
		for name, call := range map[string]func() error{
			"Get": func() error {
				_, err := c.Get(t.Context(), "nope")
				return err
			},
			"Delete": func() error { return c.Delete(t.Context(), "nope") },
			"Key": func() error {
				_, err := c.Key(t.Context(), "nope")
				return err
			},
			"Report": func() error {
				_, err := c.Report(t.Context(), "nope", uuid.NewString(), catalog.OutcomeSuccess, 0, now)
				return err
			},
		} {
			err := call()
			require.ErrorIs(t, err, catalog.ErrNotFound, name)
			require.False(t, errors.Is(err, optimistic.ErrStore), name)
		}
	})
}

func TestDatabaseFailures(t *testing.T) {
	c, db := newCatalog(t)
	require.NoError(t, c.Ping(t.Context()))

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := c.Get(ctx, "k1")
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, `catalog: get key "k1"`)
	require.NotContains(t, err.Error(), "optimistic:", "the text names the catalog, not a lease store")

	require.NoError(t, db.Close())
	err = c.Ping(t.Context())
	require.ErrorIs(t, err, optimistic.ErrStore)
	require.Equal(t, "catalog: ping: sql: database is closed", err.Error(), "not a lease store's failure")
	_, err = c.Put(t.Context(), testKey("k1"))
	require.ErrorIs(t, err, optimistic.ErrStore)
	require.NotContains(t, err.Error(), optimistic.ErrStore.Error())
	require.NotContains(t, err.Error(), secret)
}

// A PostgreSQL server that went away makes every call a store failure,
// whose error carries no secret.
func TestPostgresDown(t *testing.T) {
	srv, err := pgproc.Run()
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	require.NoError(t, srv.CreateDB(t.Context(), "credpool"))
	db, err := postgres.Open(t.Context(), srv.URL("credpool"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	c, err := catalog.NewPostgres(t.Context(), db, nil)
	require.NoError(t, err)
	put(t, c, testKey("k1"))

	srv.Stop()
	require.ErrorIs(t, c.Ping(t.Context()), optimistic.ErrStore)
	_, err = c.Get(t.Context(), "k1")
	require.ErrorIs(t, err, optimistic.ErrStore)
	require.ErrorContains(t, err, `catalog: get key "k1": `)
	require.NotContains(t, err.Error(), optimistic.ErrStore.Error(), "the text names the catalog, not a lease store")
	_, err = c.Put(t.Context(), testKey("k1"))
	require.ErrorIs(t, err, optimistic.ErrStore)
	require.NotContains(t, err.Error(), secret)
}

// A write the database itself refuses (a read-only file here, so the
// statement reaches SQLite) is a store failure, and its error does not
// carry the secret it was given either.
func TestDatabaseRefusesWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "credpool.db")
	_, err := catalog.New(t.Context(), openDB(t, path), nil)
	require.NoError(t, err)
	ro, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ro.Close() })
	c, err := catalog.New(t.Context(), sqlitex.Wrap(ro), nil)
	require.NoError(t, err, "a current schema is only read")

	_, err = c.Put(t.Context(), testKey("k1"))
	require.ErrorIs(t, err, optimistic.ErrStore)
	require.ErrorContains(t, err, "readonly", "SQLite itself refused it")
	require.NotContains(t, err.Error(), secret)
}
