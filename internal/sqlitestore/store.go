package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/credpool/credpool/internal/retry"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
)

var _ optimistic.LeaseStore = (*Store)(nil)

// Options configure a Store. A nil *Options means all defaults.
type Options struct {
	// MaxBusyRetries bounds the transactions retried in one call after
	// SQLite reported the database busy or locked.
	//
	// default: 10
	MaxBusyRetries int

	// MinBackoff is the first pause after a busy transaction; later pauses
	// grow by 2x with ±50% jitter.
	//
	// default: 1ms
	MinBackoff time.Duration

	// MaxBackoff caps one pause.
	//
	// default: 64ms
	MaxBackoff time.Duration

	// MaxElapsed bounds the time one call spends retrying busy transactions.
	// A transaction already waiting in SQLite's busy handler finishes its
	// wait first.
	//
	// default: 2s
	MaxElapsed time.Duration
}

// Store is the lease store on SQLite. It is safe for concurrent use, and
// several processes may use the same file at once.
type Store struct {
	db     *sql.DB
	policy retry.Policy
	// writer admits one write transaction of this Store at a time (see
	// "Locking" in the package doc).
	writer chan struct{}
}

// New returns a Store over db, which must use the modernc.org/sqlite driver
// (open it with sqlitex.Open, or add _txlock=immediate to its DSN). It
// creates or upgrades the store's lease_* tables under ctx; on a file whose
// schema is current it writes nothing, so a read-only file still serves
// Inspect.
func New(ctx context.Context, db *sql.DB, opts *Options) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlitestore: nil database")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	// Zero fields take retry.Policy's defaults, which are the ones above.
	s := &Store{
		db: db, writer: make(chan struct{}, 1),
		policy: retry.Policy{MaxRetries: o.MaxBusyRetries, MinBackoff: o.MinBackoff, MaxBackoff: o.MaxBackoff, MaxElapsed: o.MaxElapsed},
	}
	if err := sqlitex.Migrate(ctx, db, schema, s.policy); err != nil {
		return nil, classify(ctx, "open", err)
	}
	return s, nil
}

// Ping checks that the file answers and holds the store's tables.
func (s *Store) Ping(ctx context.Context) error {
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM lease_schema`).Scan(&n)
	return classify(ctx, "ping", err)
}

// txFunc is the body of one transaction; now is the store's clock in ms.
// It may run again after a busy rollback, so it must have no side effects
// outside tx.
type txFunc func(tx *sql.Tx, now int64) error

// do runs fn in a transaction (IMMEDIATE unless readOnly) and commits it,
// retrying busy transactions under the policy of Options. The Stats count
// transactions tried and those that found the file busy (the last one too,
// if the budget ran out on it), as the Redis store counts aborted EXECs.
// It returns the raw error; callers classify it.
func (s *Store) do(ctx context.Context, readOnly bool, fn txFunc) (optimistic.Stats, error) {
	var st optimistic.Stats
	err := retry.Do(ctx, s.policy, sqlitex.Busy, func() (err error) {
		st.Attempts++
		defer func() {
			if sqlitex.Busy(err) {
				st.Conflicts++
			}
		}()
		if !readOnly {
			select {
			case s.writer <- struct{}{}:
			case <-ctx.Done():
				return ctx.Err()
			}
			defer func() { <-s.writer }()
		}
		return sqlitex.InTx(ctx, s.db, &sql.TxOptions{ReadOnly: readOnly}, func(tx *sql.Tx) error {
			// Read after BEGIN: a writer holds the lock, so the clock
			// agrees with the order in which transactions commit.
			return fn(tx, time.Now().UnixMilli())
		})
	})
	return st, err
}

// fromMillis converts ms since the epoch; 0 stays the zero Time.
func fromMillis(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// toMillis converts t to ms since the epoch; the zero Time becomes NULL.
func toMillis(t time.Time) sql.NullInt64 {
	return sql.NullInt64{Int64: t.UnixMilli(), Valid: !t.IsZero()}
}
