package sqlitestore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/credpool/credpool/internal/sqlitex"
)

// EnsureID makes id the store's id unless the file holds one, and returns
// the id it holds and whether it wrote id: the service names the store by
// it, so two files are two stores, and a file that loses its tables
// loses its id too. A file that holds an id is only read, so a read-only
// file still answers. On failure nothing is written.
func (s *Store) EnsureID(ctx context.Context, id string) (string, bool, error) {
	if s.closed.Load() {
		return "", false, errClosed
	}
	var have string
	err := s.db.QueryRowContext(ctx, `SELECT value FROM lease_meta WHERE name = 'store_id'`).Scan(&have)
	if !errors.Is(err, sql.ErrNoRows) {
		return have, false, sqlitex.Classify(ctx, "read store id", err)
	}
	wrote := false
	_, err = s.do(ctx, false, func(tx *sql.Tx, _ int64) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO lease_meta (name, value) VALUES ('store_id', ?)
			ON CONFLICT (name) DO NOTHING`, id)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		wrote = n == 1
		return tx.QueryRowContext(ctx, `SELECT value FROM lease_meta WHERE name = 'store_id'`).Scan(&have)
	})
	if err != nil {
		return "", false, sqlitex.Classify(ctx, "write store id", err)
	}
	return have, wrote, nil
}
