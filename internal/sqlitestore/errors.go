package sqlitestore

import (
	"context"

	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
)

// classify is optimistic.Classify after marking SQLite's busy or locked
// errors as the contract's conflict: one still busy after the retries is
// optimistic.ErrContended, never a store failure.
func classify(ctx context.Context, op string, err error) error {
	return optimistic.Classify(ctx, op, sqlitex.Conflict(err))
}
