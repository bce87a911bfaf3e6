package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"github.com/credpool/credpool/optimistic"
)

// Requests remembers, in the SQLite file, which lease answered an allocate
// request id, so that a retried request gets the same lease back instead
// of a second slot. It is safe for concurrent use, across processes too.
type Requests struct{ s *Store }

// Requests returns the request log that lives beside the store's leases.
func (s *Store) Requests() *Requests { return &Requests{s: s} }

// Claim reserves id for ttl. It returns claimed true if the caller now owns
// id and must Record or Forget it; else the lease that already answered id.
// optimistic.ErrRequestInFlight if another caller owns id and has not
// recorded yet.
func (r *Requests) Claim(ctx context.Context, id string, ttl time.Duration) (optimistic.Lease, bool, error) {
	var (
		raw     sql.NullString
		claimed bool
	)
	_, err := r.s.do(ctx, false, func(tx *sql.Tx, now int64) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM lease_requests WHERE id = ? AND until <= ?`, id, now); err != nil {
			return err
		}
		err := tx.QueryRowContext(ctx, `SELECT lease FROM lease_requests WHERE id = ?`, id).Scan(&raw)
		if !errors.Is(err, sql.ErrNoRows) {
			claimed = false
			return err
		}
		claimed = true
		_, err = tx.ExecContext(ctx, `INSERT INTO lease_requests (id, lease, until) VALUES (?, NULL, ?)`, id, now+ttl.Milliseconds())
		return err
	})
	switch {
	case err != nil:
		return optimistic.Lease{}, false, classify(ctx, "claim request", err)
	case claimed:
		return optimistic.Lease{}, true, nil
	case !raw.Valid:
		return optimistic.Lease{}, false, optimistic.ErrRequestInFlight
	}
	var l optimistic.Lease
	if err := json.Unmarshal([]byte(raw.String), &l); err != nil {
		return optimistic.Lease{}, false, classify(ctx, "claim request", err)
	}
	return l, false, nil
}

// Record stores the lease that answered id until the lease ends.
func (r *Requests) Record(ctx context.Context, id string, l optimistic.Lease) error {
	raw, err := json.Marshal(l)
	if err != nil {
		return err
	}
	_, err = r.s.do(ctx, false, func(tx *sql.Tx, _ int64) error {
		_, err := tx.ExecContext(ctx, `UPDATE lease_requests SET lease = ?, until = ? WHERE id = ?`, string(raw), l.Until.UnixMilli(), id)
		return err
	})
	return classify(ctx, "record request", err)
}

// Forget drops id: its allocation failed or its lease is gone.
func (r *Requests) Forget(ctx context.Context, id string) error {
	_, err := r.s.do(ctx, false, func(tx *sql.Tx, _ int64) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM lease_requests WHERE id = ?`, id)
		return err
	})
	return classify(ctx, "forget request", err)
}
