package catalog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/credpool/credpool/optimistic"
)

// DefaultRetryAfter is the cooldown Report applies to a rate_limited
// outcome that came without a usable retry-after.
const DefaultRetryAfter = 60 * time.Second

// ReportMemory is how long Report remembers a lease it counted, so that the
// lease reported again is not counted twice. It is far longer than a lease
// can be retried: a report is only taken for a lease still held.
const ReportMemory = 24 * time.Hour

// MarkSynced records that the keys reached the lease store named store at
// at, in one transaction, unless they had reached that store before: from
// then on, that store lacking a key means it lost state (see Quarantine).
// A key synced to another store before starts again. With one id a missing
// key is ErrNotFound; with several, missing keys are skipped.
func (s *SQL) MarkSynced(ctx context.Context, store string, at time.Time, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	return s.write(ctx, fmt.Sprintf("mark %d keys synced", len(ids)), func(tx txn, gen int64) error {
		for _, id := range ids {
			res, err := tx.ExecContext(ctx, `UPDATE catalog_keys SET
				synced_at = CASE WHEN synced_store = ? AND synced_at IS NOT NULL THEN synced_at ELSE ? END,
				synced_store = ?, gen = ?
			WHERE id = ?`, store, at.UnixMilli(), store, gen, id)
			if err := found(res, err, id); err != nil && (len(ids) == 1 || !errors.Is(err, ErrNotFound)) {
				return err
			}
		}
		return nil
	})
}

// Quarantine keeps the key from taking leases until until (or later, if it
// is held back longer already), whatever its status: the broker uses it
// when the lease store lost the key's state, since leases it no longer
// knows of may still be in use until then. Put leaves a quarantine alone.
// It returns the key as updated, without its secret; a missing key is
// ErrNotFound.
func (s *SQL) Quarantine(ctx context.Context, id string, until, now time.Time) (Key, error) {
	var k Key
	err := s.write(ctx, fmt.Sprintf("quarantine key %q", id), func(tx txn, gen int64) error {
		ms := until.UnixMilli()
		res, err := tx.ExecContext(ctx, `UPDATE catalog_keys SET
			quarantine_until = CASE WHEN quarantine_until IS NULL OR quarantine_until < ? THEN ? ELSE quarantine_until END,
			updated_at = ?, gen = ?
		WHERE id = ?`, ms, ms, now.UnixMilli(), gen, id)
		if err := found(res, err, id); err != nil {
			return err
		}
		k, err = getKey(ctx, tx, id, false)
		return err
	})
	return k, err
}

// Lift ends the key's quarantine at once, and reports whether it had one:
// an operator's word that the leases the lease store lost (or another
// store granted) are no longer in use. A missing key is ErrNotFound.
func (s *SQL) Lift(ctx context.Context, id string, now time.Time) (bool, error) {
	lifted := false
	err := s.write(ctx, fmt.Sprintf("lift the quarantine of key %q", id), func(tx txn, gen int64) error {
		res, err := tx.ExecContext(ctx, `UPDATE catalog_keys SET quarantine_until = NULL, updated_at = ?, gen = ?
		WHERE id = ? AND quarantine_until IS NOT NULL`, now.UnixMilli(), gen, id)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if n == 0 {
			if _, err := getKey(ctx, tx, id, false); err != nil {
				return err
			}
			return errUnchanged
		}
		lifted = true
		return nil
	})
	return lifted, err
}

// Quarantined counts the keys held back at now and says until when the
// last of them is.
func (s *SQL) Quarantined(ctx context.Context, now time.Time) (int, time.Time, error) {
	var (
		n     int
		until sql.NullInt64
	)
	err := s.db.QueryRowContext(ctx, `SELECT COUNT(*), MAX(quarantine_until) FROM catalog_keys WHERE quarantine_until > ?`,
		now.UnixMilli()).Scan(&n, &until)
	if err != nil {
		return 0, time.Time{}, fail(ctx, "count quarantined keys", err)
	}
	return n, fromMillis(until), nil
}

// RecoverCooldown makes the key available again if it is rate_limited or
// cooldown and its cooldown_until is set and not after now, clears a
// quarantine that has ended, and reports whether it changed anything. It
// is one conditional UPDATE, so concurrent brokers recover a key once and
// never undo a newer rate limit or quarantine. A missing key reports false.
func (s *SQL) RecoverCooldown(ctx context.Context, id string, now time.Time) (bool, error) {
	ms := now.UnixMilli()
	var n int64
	err := s.write(ctx, fmt.Sprintf("recover key %q", id), func(tx txn, gen int64) error {
		res, err := tx.ExecContext(ctx, `UPDATE catalog_keys SET
			status = CASE WHEN status IN (?, ?) AND cooldown_until IS NOT NULL AND cooldown_until <= ? THEN ? ELSE status END,
			cooldown_until = CASE WHEN status IN (?, ?) AND cooldown_until IS NOT NULL AND cooldown_until <= ? THEN NULL ELSE cooldown_until END,
			quarantine_until = CASE WHEN quarantine_until <= ? THEN NULL ELSE quarantine_until END,
			updated_at = ?, gen = ?
		WHERE id = ? AND (
			(status IN (?, ?) AND cooldown_until IS NOT NULL AND cooldown_until <= ?) OR quarantine_until <= ?)`,
			string(optimistic.StatusRateLimited), string(optimistic.StatusCooldown), ms, string(optimistic.StatusAvailable),
			string(optimistic.StatusRateLimited), string(optimistic.StatusCooldown), ms,
			ms, ms, gen, id,
			string(optimistic.StatusRateLimited), string(optimistic.StatusCooldown), ms, ms)
		if err != nil {
			return err
		}
		if n, err = res.RowsAffected(); err == nil && n == 0 {
			err = errUnchanged
		}
		return err
	})
	return n > 0, err
}

// Report applies one outcome of a use of the key at now and returns the
// key as updated, without its secret:
//
//   - success: successes+1.
//   - error: errors+1.
//   - rate_limited: rate_limit_hits+1; cooldown_until becomes
//     now+retryAfter (DefaultRetryAfter if retryAfter <= 0) unless it is
//     already later, so reports arriving out of order only move it later;
//     status becomes rate_limited if it was available, rate_limited or
//     cooldown. A disabled, exhausted or pending key keeps its status: a
//     late report from an old lease must not revive it.
//   - auth_error: errors+1, status disabled.
//
// A report names the lease it is about, and counts once per lease: the
// same lease reported again (a retry after a failed release, say) changes
// nothing and returns the key as it is. Lease ids are remembered for
// ReportMemory. The update and the read back are one transaction. A
// missing key is ErrNotFound, an unknown outcome or an empty lease id
// optimistic.ErrInvalid.
func (s *SQL) Report(ctx context.Context, id, leaseID string, o Outcome, retryAfter time.Duration, now time.Time) (Key, error) {
	ms := now.UnixMilli()
	if leaseID == "" {
		return Key{}, invalidf("lease id of a report on key %s: want non-empty", id)
	}
	var set string
	var args []any
	switch o {
	case OutcomeSuccess:
		set = `successes = successes + 1`
	case OutcomeError:
		set = `errors = errors + 1`
	case OutcomeAuthError:
		set, args = `errors = errors + 1, status = ?`, []any{string(optimistic.StatusDisabled)}
	case OutcomeRateLimited:
		if retryAfter <= 0 {
			retryAfter = DefaultRetryAfter
		}
		until := now.Add(retryAfter).UnixMilli()
		set = `rate_limit_hits = rate_limit_hits + 1,
			status = CASE WHEN status IN (?, ?, ?) THEN ? ELSE status END,
			cooldown_until = CASE WHEN cooldown_until IS NULL OR cooldown_until < ? THEN ? ELSE cooldown_until END`
		args = []any{
			string(optimistic.StatusAvailable), string(optimistic.StatusRateLimited), string(optimistic.StatusCooldown),
			string(optimistic.StatusRateLimited), until, until,
		}
	default:
		return Key{}, invalidf("outcome: want success, error, rate_limited or auth_error")
	}
	var k Key
	err := s.write(ctx, fmt.Sprintf("report %s on key %q", o, id), func(tx txn, gen int64) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO catalog_reports (lease_id, key_id, outcome, reported_at)
		VALUES (?, ?, ?, ?) ON CONFLICT (lease_id) DO NOTHING`, leaseID, id, string(o), ms)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			if err == nil {
				// Counted before: nothing changes.
				if k, err = getKey(ctx, tx, id, false); err == nil {
					err = errUnchanged
				}
			}
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM catalog_reports WHERE reported_at < ?`, now.Add(-ReportMemory).UnixMilli()); err != nil {
			return err
		}
		res, err = tx.ExecContext(ctx, `UPDATE catalog_keys SET `+set+`, updated_at = ?, gen = ? WHERE id = ?`, append(args, ms, gen, id)...)
		if err := found(res, err, id); err != nil {
			return err
		}
		k, err = getKey(ctx, tx, id, false)
		return err
	})
	return k, err
}
