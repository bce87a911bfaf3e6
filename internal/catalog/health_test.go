package catalog_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/optimistic"
)

var t0 = time.UnixMilli(1_800_000_000_000).UTC()

func TestReport(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		tests := []struct {
			name       string
			status     optimistic.Status
			outcome    catalog.Outcome
			retryAfter time.Duration
			// want: successes, errors, rate limit hits
			want         [3]int64
			wantStatus   optimistic.Status
			wantCooldown time.Time
		}{
			{"success", optimistic.StatusAvailable, catalog.OutcomeSuccess, 0, [3]int64{1, 0, 0}, optimistic.StatusAvailable, time.Time{}},
			{"error", optimistic.StatusAvailable, catalog.OutcomeError, 0, [3]int64{0, 1, 0}, optimistic.StatusAvailable, time.Time{}},
			{"auth error disables", optimistic.StatusAvailable, catalog.OutcomeAuthError, 0, [3]int64{0, 1, 0}, optimistic.StatusDisabled, time.Time{}},
			{"rate limited", optimistic.StatusAvailable, catalog.OutcomeRateLimited, 30 * time.Second, [3]int64{0, 0, 1}, optimistic.StatusRateLimited, t0.Add(30 * time.Second)},
			{"rate limited, default retry", optimistic.StatusAvailable, catalog.OutcomeRateLimited, 0, [3]int64{0, 0, 1}, optimistic.StatusRateLimited, t0.Add(catalog.DefaultRetryAfter)},
			{"rate limited, negative retry", optimistic.StatusAvailable, catalog.OutcomeRateLimited, -time.Second, [3]int64{0, 0, 1}, optimistic.StatusRateLimited, t0.Add(catalog.DefaultRetryAfter)},
			{"rate limited in cooldown", optimistic.StatusCooldown, catalog.OutcomeRateLimited, time.Second, [3]int64{0, 0, 1}, optimistic.StatusRateLimited, t0.Add(time.Second)},
			{"disabled stays disabled", optimistic.StatusDisabled, catalog.OutcomeRateLimited, time.Second, [3]int64{0, 0, 1}, optimistic.StatusDisabled, t0.Add(time.Second)},
			{"exhausted stays exhausted", optimistic.StatusExhausted, catalog.OutcomeRateLimited, time.Second, [3]int64{0, 0, 1}, optimistic.StatusExhausted, t0.Add(time.Second)},
			{"success keeps a cooldown", optimistic.StatusRateLimited, catalog.OutcomeSuccess, 0, [3]int64{1, 0, 0}, optimistic.StatusRateLimited, time.Time{}},
		}
		c := db.open(t, nil)
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				k := testKey(fmt.Sprintf("k%d", i))
				k.Status = tt.status
				put(t, c, k)

				got, err := c.Report(t.Context(), k.ID, uuid.NewString(), tt.outcome, tt.retryAfter, t0)
				require.NoError(t, err)
				require.Equal(t, tt.want, [3]int64{got.Successes, got.Errors, got.RateLimitHits})
				require.Equal(t, tt.wantStatus, got.Status)
				require.Equal(t, tt.wantCooldown, got.CooldownUntil)
				require.Equal(t, t0, got.UpdatedAt)
				require.Equal(t, got, noSecret(get(t, c, k.ID)))
				require.Empty(t, got.Secret.Reveal(), "only Get reads a secret")
			})
		}
	})
}

func TestReportCooldownOnlyMovesLater(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, nil)
		put(t, c, testKey("k1"))
		report := func(retryAfter time.Duration, now time.Time) time.Time {
			t.Helper()
			k, err := c.Report(t.Context(), "k1", uuid.NewString(), catalog.OutcomeRateLimited, retryAfter, now)
			require.NoError(t, err)
			return k.CooldownUntil
		}

		require.Equal(t, t0.Add(2*time.Minute), report(2*time.Minute, t0))
		require.Equal(t, t0.Add(2*time.Minute), report(10*time.Second, t0), "shorter retry keeps the later end")
		require.Equal(t, t0.Add(2*time.Minute), report(time.Second, t0.Add(time.Minute)), "out of order report")
		require.Equal(t, t0.Add(5*time.Minute), report(4*time.Minute, t0.Add(time.Minute)))
		require.Equal(t, int64(4), get(t, c, "k1").RateLimitHits)
	})
}

// Reports from many goroutines over two connection pools: each is one
// transaction, so none is lost and none fails on a busy database.
func TestReportConcurrent(t *testing.T) {
	for name, open := range openers {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "credpool.db")
			var cats []*catalog.SQL
			for range 2 {
				c, err := catalog.New(t.Context(), open(t, path), nil)
				require.NoError(t, err)
				cats = append(cats, c)
			}
			put(t, cats[0], testKey("k1"))

			const workers, reports = 8, 10
			errs := make(chan error, workers)
			for w := range workers {
				go func() {
					c := cats[w%len(cats)]
					for i := range reports {
						o := catalog.OutcomeSuccess
						if i%2 == 1 {
							o = catalog.OutcomeRateLimited
						}
						if _, err := c.Report(t.Context(), "k1", uuid.NewString(), o, time.Duration(w*reports+i)*time.Millisecond, t0); err != nil {
							errs <- err
							return
						}
					}
					errs <- nil
				}()
			}
			for range workers {
				require.NoError(t, <-errs)
			}

			k := get(t, cats[1], "k1")
			require.Equal(t, int64(workers*reports/2), k.Successes)
			require.Equal(t, int64(workers*reports/2), k.RateLimitHits)
			require.Equal(t, t0.Add(time.Duration(workers*reports-1)*time.Millisecond), k.CooldownUntil)
		})
	}
}

func TestReportRejectsUnknownOutcome(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, nil)
		put(t, c, testKey("k1"))
		_, err := c.Report(t.Context(), "k1", uuid.NewString(), "timeout", 0, t0)
		require.ErrorIs(t, err, optimistic.ErrInvalid)
		require.Contains(t, err.Error(), "outcome")
		require.Zero(t, get(t, c, "k1").Errors)
	})
}

func TestRecoverCooldown(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		tests := []struct {
			name     string
			status   optimistic.Status
			cooldown time.Time
			want     bool
		}{
			{"rate limited, passed", optimistic.StatusRateLimited, t0.Add(-time.Second), true},
			{"rate limited, ends now", optimistic.StatusRateLimited, t0, true},
			{"cooldown, passed", optimistic.StatusCooldown, t0.Add(-time.Hour), true},
			{"rate limited, running", optimistic.StatusRateLimited, t0.Add(time.Millisecond), false},
			{"rate limited, no cooldown", optimistic.StatusRateLimited, time.Time{}, false},
			{"cooldown, no cooldown", optimistic.StatusCooldown, time.Time{}, false},
			{"disabled, passed", optimistic.StatusDisabled, t0.Add(-time.Second), false},
			{"available, passed", optimistic.StatusAvailable, t0.Add(-time.Second), false},
		}
		c := db.open(t, nil)
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				k := testKey(fmt.Sprintf("k%d", i))
				k.Status, k.CooldownUntil = tt.status, tt.cooldown
				put(t, c, k)

				changed, err := c.RecoverCooldown(t.Context(), k.ID, t0)
				require.NoError(t, err)
				require.Equal(t, tt.want, changed)
				got := get(t, c, k.ID)
				if tt.want {
					require.Equal(t, optimistic.StatusAvailable, got.Status)
					require.True(t, got.CooldownUntil.IsZero())
					require.Equal(t, t0, got.UpdatedAt)
					return
				}
				require.Equal(t, tt.status, got.Status)
				require.Equal(t, tt.cooldown, got.CooldownUntil)
			})
		}

		changed, err := c.RecoverCooldown(t.Context(), "missing", t0)
		require.NoError(t, err)
		require.False(t, changed)
	})
}

// A lease counts once: reported again (a retry after its release failed)
// it changes nothing. The memory of counted leases is pruned after
// ReportMemory.
func TestReportCountsOncePerLease(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, nil)
		put(t, c, testKey("k1"))
		for range 3 {
			k, err := c.Report(t.Context(), "k1", "lease-1", catalog.OutcomeRateLimited, time.Minute, t0)
			require.NoError(t, err)
			require.Equal(t, int64(1), k.RateLimitHits)
			require.Equal(t, t0.Add(time.Minute), k.CooldownUntil)
		}
		k, err := c.Report(t.Context(), "k1", "lease-2", catalog.OutcomeSuccess, 0, t0)
		require.NoError(t, err)
		require.Equal(t, []int64{1, 1}, []int64{k.Successes, k.RateLimitHits})

		_, err = c.Report(t.Context(), "k1", "", catalog.OutcomeSuccess, 0, t0)
		require.ErrorIs(t, err, optimistic.ErrInvalid)

		// A day later lease-1 is forgotten (a lease never lives that long
		// unreported), so the id could count again.
		later := t0.Add(catalog.ReportMemory + time.Minute)
		_, err = c.Report(t.Context(), "k1", "lease-3", catalog.OutcomeSuccess, 0, later)
		require.NoError(t, err)
		k, err = c.Report(t.Context(), "k1", "lease-1", catalog.OutcomeSuccess, 0, later)
		require.NoError(t, err)
		require.Equal(t, int64(3), k.Successes)
	})
}

func TestMarkSyncedKeepsTheFirstTime(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, nil)
		put(t, c, testKey("k1"))
		require.True(t, get(t, c, "k1").SyncedAt.IsZero())
		require.NoError(t, c.MarkSynced(t.Context(), "redis-a", t0, "k1"))
		require.NoError(t, c.MarkSynced(t.Context(), "redis-a", t0.Add(time.Hour), "k1"))
		k := get(t, c, "k1")
		require.Equal(t, t0, k.SyncedAt)
		require.Equal(t, "redis-a", k.SyncedStore)
		put(t, c, testKey("k1"))
		require.Equal(t, t0, get(t, c, "k1").SyncedAt, "an admin upsert keeps it")

		require.NoError(t, c.MarkSynced(t.Context(), "redis-b", t0.Add(2*time.Hour), "k1"))
		k = get(t, c, "k1")
		require.Equal(t, t0.Add(2*time.Hour), k.SyncedAt, "another store starts again")
		require.Equal(t, "redis-b", k.SyncedStore)
		require.ErrorIs(t, c.MarkSynced(t.Context(), "redis-a", t0, "nope"), catalog.ErrNotFound)

		put(t, c, testKey("k2"))
		require.NoError(t, c.MarkSynced(t.Context(), "redis-b", t0, "k2", "nope", "k1"), "several: missing ones skipped")
		require.Equal(t, "redis-b", get(t, c, "k2").SyncedStore)
		require.Equal(t, t0.Add(2*time.Hour), get(t, c, "k1").SyncedAt, "kept")
	})
}

// A quarantine holds a key back whatever its status, survives an admin
// upsert, only moves later, and ends by itself.
func TestQuarantine(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, nil)
		put(t, c, testKey("k1"))
		k, err := c.Quarantine(t.Context(), "k1", t0.Add(time.Hour), t0)
		require.NoError(t, err)
		require.Equal(t, t0.Add(time.Hour), k.QuarantineUntil)
		require.Equal(t, optimistic.StatusAvailable, k.Status, "the status is the operator's")
		require.False(t, k.Usable(t0.Add(time.Hour-time.Millisecond)))
		require.True(t, k.Usable(t0.Add(time.Hour)))
		require.Equal(t, t0.Add(time.Hour), k.UsableAt())
		ls := k.LeaseState()
		require.Equal(t, optimistic.StatusCooldown, ls.Status, "the store refuses it until then")
		require.Equal(t, t0.Add(time.Hour), ls.CooldownUntil)

		_, err = c.Quarantine(t.Context(), "k1", t0.Add(time.Minute), t0)
		require.NoError(t, err)
		require.Equal(t, t0.Add(time.Hour), get(t, c, "k1").QuarantineUntil, "only moves later")

		upsert := testKey("k1")
		upsert.Models = []string{"gpt-4o", "o1"}
		put(t, c, upsert)
		require.Equal(t, t0.Add(time.Hour), get(t, c, "k1").QuarantineUntil, "an admin upsert does not lift it")

		n, until, err := c.Quarantined(t.Context(), t0)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, t0.Add(time.Hour), until)

		changed, err := c.RecoverCooldown(t.Context(), "k1", t0.Add(time.Minute))
		require.NoError(t, err)
		require.False(t, changed, "not over yet")
		changed, err = c.RecoverCooldown(t.Context(), "k1", t0.Add(time.Hour))
		require.NoError(t, err)
		require.True(t, changed)
		k = get(t, c, "k1")
		require.True(t, k.QuarantineUntil.IsZero())
		require.Equal(t, optimistic.StatusAvailable, k.LeaseState().Status)
		n, _, err = c.Quarantined(t.Context(), t0)
		require.NoError(t, err)
		require.Zero(t, n)

		disabled := testKey("k2")
		disabled.Status = optimistic.StatusDisabled
		put(t, c, disabled)
		k, err = c.Quarantine(t.Context(), "k2", t0.Add(time.Hour), t0)
		require.NoError(t, err)
		require.Equal(t, optimistic.StatusDisabled, k.LeaseState().Status)
		require.True(t, k.UsableAt().IsZero(), "disabled stays out")

		_, err = c.Quarantine(t.Context(), "nope", t0, t0)
		require.ErrorIs(t, err, catalog.ErrNotFound)
	})
}
