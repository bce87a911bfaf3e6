package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
)

// Release deletes the lease if key id, provider, pool and lease id all
// match and it has not expired. Otherwise it returns ErrLeaseLost (unknown,
// released, expired, or recorded under another key id) or ErrLeaseMismatch
// (wrong provider or pool), and writes nothing. Releasing twice is harmless:
// the second call is ErrLeaseLost. It never touches another lease.
func (s *Store) Release(ctx context.Context, ref optimistic.LeaseRef) error {
	if err := ref.Validate(); err != nil {
		return err
	}
	_, err := s.do(ctx, false, func(tx *sql.Tx, now int64) error {
		if _, err := s.holds(ctx, tx, ref, now); err != nil {
			return err
		}
		_, err := s.on(ctx, tx, qDeleteLease).ExecContext(ctx, ref.LeaseID)
		return err
	})
	if err == nil {
		s.changed()
		s.queue.Wake(ref.KeyID)
	}
	return sqlitex.Classify(ctx, "release", err)
}

// Holds returns the lease's expiry if ref holds a live lease, else
// ErrLeaseLost or ErrLeaseMismatch as Release would. It reads only.
func (s *Store) Holds(ctx context.Context, ref optimistic.LeaseRef) (time.Time, error) {
	if err := ref.Validate(); err != nil {
		return time.Time{}, err
	}
	var until int64
	_, err := s.do(ctx, true, func(tx *sql.Tx, now int64) (err error) {
		until, err = s.holds(ctx, tx, ref, now)
		return err
	})
	if err != nil {
		return time.Time{}, sqlitex.Classify(ctx, "holds", err)
	}
	return fromMillis(until), nil
}

// Renew moves a live lease's expiry to now+ttl (store clock) and returns it.
// A lease that expired, was released or pruned, or does not match is lost
// (ErrLeaseLost, ErrLeaseMismatch) and is never recreated. On error nothing
// is written.
func (s *Store) Renew(ctx context.Context, ref optimistic.LeaseRef, ttl time.Duration) (time.Time, error) {
	if err := ref.Validate(); err != nil {
		return time.Time{}, err
	}
	if err := optimistic.CheckTTL(ttl); err != nil {
		return time.Time{}, err
	}
	var until int64
	_, err := s.do(ctx, false, func(tx *sql.Tx, now int64) error {
		if _, err := s.holds(ctx, tx, ref, now); err != nil {
			return err
		}
		until = now + ttl.Milliseconds()
		_, err := s.on(ctx, tx, qRenewLease).ExecContext(ctx, until, ref.LeaseID)
		return err
	})
	if err != nil {
		return time.Time{}, sqlitex.Classify(ctx, "renew", err)
	}
	s.changed()
	return fromMillis(until), nil
}

// holds says whether ref holds a live lease at now and returns its expiry
// (ms). Like the Redis store it looks the lease up under ref's key only, so
// a wrong key id is "unknown", not a mismatch.
func (s *Store) holds(ctx context.Context, tx *sql.Tx, ref optimistic.LeaseRef, now int64) (int64, error) {
	var (
		provider, pool string
		until          int64
	)
	err := s.on(ctx, tx, qHolds).QueryRowContext(ctx, ref.LeaseID, ref.KeyID).Scan(&provider, &pool, &until)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, optimistic.NotHeld(ref.LeaseID, optimistic.LostUnknown)
	case err != nil:
		return 0, err
	case provider != ref.Provider || pool != ref.Pool:
		return 0, optimistic.NotHeld(ref.LeaseID, optimistic.LostMismatch)
	case until <= now:
		return 0, optimistic.NotHeld(ref.LeaseID, optimistic.LostExpired)
	}
	return until, nil
}
