package catalog_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/optimistic"
)

// twoProcesses returns two catalogs on db, each with its own connections,
// as two processes sharing the database have.
func twoProcesses(t *testing.T, db database) (here, there *catalog.SQL) {
	t.Helper()
	return db.open(t, nil), db.open(t, nil)
}

// hour keeps List on the snapshot it has: only the generation check of
// Key, Get and ResolveModel can see another process's change.
var hour = &catalog.CacheOptions{MaxAge: time.Hour}

// Every kind of write made by another process is seen by the next Key or
// Get: the re-check after a grant never reads a stale key.
func TestCacheSeesEveryWriteAtOnce(t *testing.T) {
	for _, tt := range []struct {
		name  string
		write func(t *testing.T, c *catalog.SQL)
		check func(t *testing.T, k catalog.Key, err error)
	}{
		{"put", func(t *testing.T, c *catalog.SQL) {
			k := testKey("k1")
			k.Status, k.Secret = optimistic.StatusDisabled, "sk-rotated"
			put(t, c, k)
		}, func(t *testing.T, k catalog.Key, err error) {
			require.NoError(t, err)
			require.Equal(t, optimistic.StatusDisabled, k.Status)
			require.Equal(t, "sk-rotated", k.Secret.Reveal())
		}},
		{"delete", func(t *testing.T, c *catalog.SQL) {
			require.NoError(t, c.Delete(t.Context(), "k1"))
		}, func(t *testing.T, _ catalog.Key, err error) {
			require.ErrorIs(t, err, catalog.ErrNotFound)
		}},
		{"report", func(t *testing.T, c *catalog.SQL) {
			_, err := c.Report(t.Context(), "k1", "lease-1", catalog.OutcomeAuthError, 0, t0)
			require.NoError(t, err)
		}, func(t *testing.T, k catalog.Key, err error) {
			require.NoError(t, err)
			require.Equal(t, optimistic.StatusDisabled, k.Status)
		}},
		{"quarantine", func(t *testing.T, c *catalog.SQL) {
			_, err := c.Quarantine(t.Context(), "k1", t0.Add(time.Hour), t0)
			require.NoError(t, err)
		}, func(t *testing.T, k catalog.Key, err error) {
			require.NoError(t, err)
			require.Equal(t, t0.Add(time.Hour), k.QuarantineUntil)
		}},
		{"recover", func(t *testing.T, c *catalog.SQL) {
			_, err := c.Quarantine(t.Context(), "k1", t0, t0)
			require.NoError(t, err)
			changed, err := c.RecoverCooldown(t.Context(), "k1", t0)
			require.NoError(t, err)
			require.True(t, changed)
		}, func(t *testing.T, k catalog.Key, err error) {
			require.NoError(t, err)
			require.True(t, k.QuarantineUntil.IsZero())
		}},
		{"mark synced", func(t *testing.T, c *catalog.SQL) {
			require.NoError(t, c.MarkSynced(t.Context(), "redis-a", t0, "k1"))
		}, func(t *testing.T, k catalog.Key, err error) {
			require.NoError(t, err)
			require.Equal(t, "redis-a", k.SyncedStore)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			engines(t, func(t *testing.T, db database) {
				here, there := twoProcesses(t, db)
				put(t, there, testKey("k1"))
				c := newCache(t, here, hour)
				k, err := c.Get(t.Context(), "k1")
				require.NoError(t, err)
				require.Equal(t, secret, k.Secret.Reveal())

				tt.write(t, there)
				k, err = c.Get(t.Context(), "k1")
				tt.check(t, k, err)
				k, err = c.Key(t.Context(), "k1")
				if err == nil {
					require.Empty(t, k.Secret.Reveal(), "Key reads no secret")
				}
			})
		})
	}
}

// List trusts a snapshot for MaxAge; a change made elsewhere reaches it
// after that, and after any ResolveModel, Key or Get at once: a request
// resolves its model first, so it ranks on the catalog of its start.
func TestCacheListWithinMaxAge(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		here, there := twoProcesses(t, db)
		put(t, there, testKey("k1"))
		c := newCache(t, here, hour)
		put(t, there, testKey("k2"))
		keys, err := c.List(t.Context(), "openai", "default")
		require.NoError(t, err)
		require.Len(t, keys, 1, "List serves its snapshot within MaxAge")

		require.NoError(t, there.SetAlias(t.Context(), "openai", "latest", "gpt-4o"))
		model, err := c.ResolveModel(t.Context(), "openai", "latest")
		require.NoError(t, err)
		require.Equal(t, "gpt-4o", model)
		keys, err = c.List(t.Context(), "openai", "default")
		require.NoError(t, err)
		require.Len(t, keys, 2, "a request's ResolveModel brings List up to date")
		for _, k := range keys {
			require.Empty(t, k.Secret.Reveal(), "listed keys carry no secret")
		}

		c = newCache(t, here, &catalog.CacheOptions{MaxAge: 10 * time.Millisecond})
		put(t, there, testKey("k3"))
		require.Eventually(t, func() bool {
			keys, err := c.List(t.Context(), "openai", "default")
			return err == nil && len(keys) == 3
		}, 10*time.Second, time.Millisecond)
	})
}

// ResolveRecent resolves from the snapshot List reads, within MaxAge, and
// names it; Current reads the generation and names the current snapshot,
// which differs once another process changed the catalog, and brings
// ResolveRecent and List up to date.
func TestCacheResolveRecentNamesItsSnapshot(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		here, there := twoProcesses(t, db)
		require.NoError(t, there.SetAlias(t.Context(), "openai", "latest", "gpt-4o"))
		c := newCache(t, here, hour)
		model, snap, err := c.ResolveRecent(t.Context(), "openai", "latest")
		require.NoError(t, err)
		require.Equal(t, "gpt-4o", model)
		now, err := c.Current(t.Context())
		require.NoError(t, err)
		require.Equal(t, snap, now, "nothing changed")

		require.NoError(t, there.SetAlias(t.Context(), "openai", "latest", "gpt-4.1"))
		model, again, err := c.ResolveRecent(t.Context(), "openai", "latest")
		require.NoError(t, err)
		require.Equal(t, "gpt-4o", model, "the snapshot within MaxAge")
		require.Equal(t, snap, again)
		now, err = c.Current(t.Context())
		require.NoError(t, err)
		require.NotEqual(t, snap, now, "the catalog moved")
		model, again, err = c.ResolveRecent(t.Context(), "openai", "latest")
		require.NoError(t, err)
		require.Equal(t, "gpt-4.1", model)
		require.Equal(t, now, again)
	})
}

// This process's own writes reach every read at once, MaxAge or not.
func TestCacheSeesOwnWritesAtOnce(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, nil)
		cc := newCache(t, c, hour)
		put(t, c, testKey("k1"))
		require.NoError(t, c.SetAlias(t.Context(), "openai", "latest", "gpt-4o"))

		keys, err := cc.List(t.Context(), "openai", "default")
		require.NoError(t, err)
		require.Len(t, keys, 1)
		model, err := cc.ResolveModel(t.Context(), "openai", "latest")
		require.NoError(t, err)
		require.Equal(t, "gpt-4o", model)

		require.NoError(t, c.Delete(t.Context(), "k1"))
		keys, err = cc.List(t.Context(), "", "")
		require.NoError(t, err)
		require.Empty(t, keys)
	})
}

// A cache further behind than the catalog remembers (its generation no
// longer logged, the tombstones it needed pruned) reloads every key, so a
// deleted key never lingers in it.
func TestCacheReloadsAllWhenFarBehind(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		here, there := twoProcesses(t, db)
		put(t, there, testKey("gone"))
		put(t, there, testKey("kept"))
		c := newCache(t, here, hour)

		require.NoError(t, there.Delete(t.Context(), "gone"))
		// What pruning does once the catalog is 10,000 generations further
		// (history_test.go runs the pruning itself).
		for _, table := range []string{"catalog_generations", "catalog_tombstones"} {
			_, err := db.ExecContext(t.Context(), `DELETE FROM `+table+` WHERE gen < (SELECT gen FROM catalog_generation)`)
			require.NoError(t, err)
		}
		put(t, there, testKey("new"))

		_, err := c.Key(t.Context(), "gone")
		require.ErrorIs(t, err, catalog.ErrNotFound)
		for _, id := range []string{"kept", "new"} {
			_, err = c.Key(t.Context(), id)
			require.NoError(t, err, id)
		}
	})
}

// Uses are written behind: nothing until a flush, then the sums per key,
// with last_used_at only moving later; the outcomes that change a key go
// to the catalog at once.
func TestCacheWritesUsesBehind(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, nil)
		put(t, c, testKey("k1"))
		cc := newCache(t, c, &catalog.CacheOptions{FlushEvery: time.Hour})

		cc.MarkUsed("k1", t0)
		cc.MarkUsed("k1", t0.Add(-time.Second))
		for i, o := range []catalog.Outcome{catalog.OutcomeSuccess, catalog.OutcomeSuccess, catalog.OutcomeError} {
			k, err := cc.Report(t.Context(), "k1", fmt.Sprintf("lease-%d", i), o, 0, t0)
			require.NoError(t, err)
			require.Zero(t, k.Successes, "the snapshot's counts until written and read")
		}
		k := get(t, c, "k1")
		require.Zero(t, k.Successes+k.Errors, "not written before the flush")
		require.True(t, k.LastUsedAt.IsZero())

		k, err := cc.Report(t.Context(), "k1", "lease-9", catalog.OutcomeRateLimited, time.Minute, t0)
		require.NoError(t, err)
		require.Equal(t, optimistic.StatusRateLimited, k.Status, "written at once")
		require.Equal(t, int64(1), k.RateLimitHits)
		updated := k.UpdatedAt

		require.NoError(t, cc.Flush(t.Context()))
		k = get(t, c, "k1")
		require.Equal(t, []int64{2, 1, 1}, []int64{k.Successes, k.Errors, k.RateLimitHits})
		require.Equal(t, t0, k.LastUsedAt)
		require.Equal(t, updated, k.UpdatedAt, "a use is not a change to the key")

		cc.MarkUsed("k1", t0.Add(-time.Hour))
		require.NoError(t, cc.Flush(t.Context()))
		require.Equal(t, t0, get(t, c, "k1").LastUsedAt, "never moves back")
	})
}

func TestCacheReportChecks(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, nil)
		put(t, c, testKey("k1"))
		cc := newCache(t, c, nil)
		_, err := cc.Report(t.Context(), "nope", "lease-1", catalog.OutcomeSuccess, 0, t0)
		require.ErrorIs(t, err, catalog.ErrNotFound)
		_, err = cc.Report(t.Context(), "k1", "", catalog.OutcomeSuccess, 0, t0)
		require.ErrorIs(t, err, optimistic.ErrInvalid)
		_, err = cc.Report(t.Context(), "k1", "lease-1", "timeout", 0, t0)
		require.ErrorIs(t, err, optimistic.ErrInvalid)
	})
}

// A flush that fails (the file locked by another process) keeps the
// batch for the next one; a key deleted meanwhile does not stop the others
// from counting; Close flushes, and a second Close does nothing.
func TestCacheFlushFailureKeepsUses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "credpool.db")
	c, err := catalog.New(t.Context(), openDB(t, path), nil)
	require.NoError(t, err)
	put(t, c, testKey("k1"))
	put(t, c, testKey("k2"))
	cc, err := catalog.NewCache(t.Context(), c, &catalog.CacheOptions{FlushEvery: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close(context.Background()) })
	_, err = cc.Report(t.Context(), "k1", "lease-1", catalog.OutcomeSuccess, 0, t0)
	require.NoError(t, err)
	_, err = cc.Report(t.Context(), "k2", "lease-2", catalog.OutcomeSuccess, 0, t0)
	require.NoError(t, err)

	other := openDB(t, path)
	lock, err := other.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	_, err = lock.ExecContext(t.Context(), `UPDATE catalog_keys SET errors = errors WHERE 0`)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	require.Error(t, cc.Flush(ctx), "the file is locked")
	require.NoError(t, lock.Rollback())
	require.Zero(t, get(t, c, "k1").Successes)

	require.NoError(t, c.Delete(t.Context(), "k2"))
	require.NoError(t, cc.Close(t.Context()))
	require.Equal(t, int64(1), get(t, c, "k1").Successes)
	require.NoError(t, cc.Close(t.Context()))
}

// Uses take no generation, so they reload nobody's snapshot; every
// process's counters reach a snapshot within CountersEvery. Writes that
// change nothing take none either.
func TestCacheCounters(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		here, there := twoProcesses(t, db)
		put(t, there, testKey("k1"))
		c := newCache(t, here, &catalog.CacheOptions{CountersEvery: 10 * time.Millisecond})
		writer := newCache(t, there, &catalog.CacheOptions{FlushEvery: time.Hour})
		gen := func() (g int64) {
			require.NoError(t, db.QueryRowContext(t.Context(), `SELECT gen FROM catalog_generation`).Scan(&g))
			return g
		}
		before := gen()
		_, err := writer.Report(t.Context(), "k1", "lease-1", catalog.OutcomeSuccess, 0, t0)
		require.NoError(t, err)
		writer.MarkUsed("k1", t0)
		require.NoError(t, writer.Flush(t.Context()))
		changed, err := there.RecoverCooldown(t.Context(), "k1", t0)
		require.NoError(t, err)
		require.False(t, changed)
		require.Equal(t, before, gen(), "a flush and a recovery of nothing move no generation")
		_, err = there.Report(t.Context(), "k1", "lease-2", catalog.OutcomeAuthError, 0, t0)
		require.NoError(t, err)
		moved := gen()
		require.Greater(t, moved, before)
		_, err = there.Report(t.Context(), "k1", "lease-2", catalog.OutcomeAuthError, 0, t0)
		require.NoError(t, err)
		require.Equal(t, moved, gen(), "a lease reported again changes nothing")

		require.Eventually(t, func() bool {
			keys, err := c.List(t.Context(), "openai", "default")
			return err == nil && len(keys) == 1 && keys[0].Successes == 1 && keys[0].LastUsedAt.Equal(t0) &&
				keys[0].Status == optimistic.StatusDisabled
		}, 10*time.Second, time.Millisecond)
	})
}

// Readers, the writer and another process's writes at once (run with
// -race); once the writes stop, the next Key sees the last of them.
func TestCacheConcurrent(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		here, there := twoProcesses(t, db)
		put(t, there, testKey("k1"))
		c := newCache(t, here, &catalog.CacheOptions{MaxAge: time.Millisecond, FlushEvery: 100 * time.Millisecond})
		stop := make(chan struct{})
		errs := make(chan error, 4)
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				for n := 0; ; n++ {
					select {
					case <-stop:
						errs <- nil
						return
					default:
					}
					_, err := c.List(t.Context(), "openai", "default")
					if err == nil {
						_, err = c.Get(t.Context(), "k1")
					}
					if err == nil {
						c.MarkUsed("k1", time.Now())
						_, err = c.Report(t.Context(), "k1", fmt.Sprintf("lease-%d-%d", i, n%10), catalog.OutcomeSuccess, 0, time.Now())
					}
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		k := testKey("k1")
		for i := range 50 {
			k.MaxConcurrentUses = i + 1
			put(t, there, k)
		}
		close(stop)
		wg.Wait()
		for range 4 {
			require.NoError(t, <-errs)
		}
		got, err := c.Key(t.Context(), "k1")
		require.NoError(t, err)
		require.Equal(t, 50, got.MaxConcurrentUses)
	})
}

// A catalog restored from a backup reaches the cache's generation again
// with other contents: the stamp tells, and the cache reloads every key.
func TestCacheReloadsAllAfterRestore(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, nil)
		put(t, c, testKey("k1"))
		cc := newCache(t, c, hour)
		k, err := cc.Key(t.Context(), "k1")
		require.NoError(t, err)
		require.Equal(t, optimistic.StatusAvailable, k.Status)

		// The backup: one generation back, k1 disabled; then one write after
		// the restore brings the generation to the number the cache holds.
		for _, q := range []string{
			`UPDATE catalog_keys SET status = 'disabled'`,
			`DELETE FROM catalog_generations WHERE gen = (SELECT gen FROM catalog_generation)`,
			`UPDATE catalog_generation SET gen = gen - 1, stamp = 'backup'`,
		} {
			_, err = db.ExecContext(t.Context(), q)
			require.NoError(t, err, q)
		}
		put(t, c, testKey("k2"))

		k, err = cc.Key(t.Context(), "k1")
		require.NoError(t, err)
		require.Equal(t, optimistic.StatusDisabled, k.Status)
	})
}

// A report of a key another process added after this snapshot was read
// (granted there, reported here) counts: Report reads the catalog for a
// key its snapshot does not have.
func TestCacheReportOfAKeyAddedElsewhere(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		here, there := twoProcesses(t, db)
		cc := newCache(t, here, &catalog.CacheOptions{MaxAge: time.Hour, FlushEvery: time.Hour})
		put(t, there, testKey("k1"))
		k, err := cc.Report(t.Context(), "k1", "lease-1", catalog.OutcomeSuccess, 0, t0)
		require.NoError(t, err)
		require.Equal(t, "k1", k.ID)
		require.NoError(t, cc.Flush(t.Context()))
		require.Equal(t, int64(1), get(t, there, "k1").Successes)
		_, err = cc.Report(t.Context(), "nope", "lease-2", catalog.OutcomeSuccess, 0, t0)
		require.ErrorIs(t, err, catalog.ErrNotFound)
	})
}
