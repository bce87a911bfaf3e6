package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	// The pure-Go SQLite driver, registered as "sqlite".
	_ "modernc.org/sqlite"

	"github.com/credpool/credpool/optimistic"
)

var _ optimistic.LeaseStore = (*Store)(nil)

// busyTimeoutMillis is how long SQLite's busy handler waits for a lock before
// a transaction counts as busy and the retry policy of Options takes over.
const busyTimeoutMillis = 1000

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

func (o *Options) withDefaults() Options {
	var out Options
	if o != nil {
		out = *o
	}
	if out.MaxBusyRetries <= 0 {
		out.MaxBusyRetries = 10
	}
	if out.MinBackoff <= 0 {
		out.MinBackoff = time.Millisecond
	}
	if out.MaxBackoff <= 0 {
		out.MaxBackoff = 64 * time.Millisecond
	}
	if out.MaxElapsed <= 0 {
		out.MaxElapsed = 2 * time.Second
	}
	return out
}

// Store is the lease store on SQLite. It is safe for concurrent use, and
// several processes may use the same file at once.
type Store struct {
	db   *sql.DB
	opts Options
	// writer admits one write transaction of this Store at a time (see
	// "Locking" in the package doc).
	writer chan struct{}
}

// New returns a Store over db, which must use the modernc.org/sqlite driver
// (open it with Open, or add _txlock=immediate to its DSN). It creates or
// upgrades the store's lease_* tables; on a file whose schema is current it
// writes nothing, so a read-only file still serves Inspect.
func New(db *sql.DB, opts *Options) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlitestore: nil database")
	}
	s := &Store{db: db, opts: opts.withDefaults(), writer: make(chan struct{}, 1)}
	ctx := context.Background()
	if err := s.migrate(ctx); err != nil {
		return nil, classify(ctx, "migrate", err)
	}
	return s, nil
}

// Open opens the SQLite file at path, creating it if needed, with what a
// Store relies on: WAL mode (readers never wait for the writer), a busy
// timeout, foreign keys, and transactions that begin IMMEDIATE. synchronous
// stays FULL, SQLite's default: a grant is on disk before Allocate returns
// it, so no fencing token is handed out twice, even across a power loss.
// The caller closes the returned db; it may share it with other tables of
// the file.
func Open(path string) (*sql.DB, error) {
	// The driver splits its parameters off at the first '?'.
	if strings.Contains(path, "?") {
		return nil, fmt.Errorf("sqlitestore: path %q must not contain '?'", path)
	}
	q := url.Values{
		"_txlock": {"immediate"},
		"_pragma": {fmt.Sprintf("busy_timeout(%d)", busyTimeoutMillis), "foreign_keys(1)", "journal_mode(WAL)"},
	}
	db, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	// sql.Open connects lazily; fail here on a bad path or file.
	if err := db.Ping(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	return db, nil
}

// txFunc is the body of one transaction; now is the store's clock in ms.
// It may run again after a busy rollback, so it must have no side effects
// outside tx.
type txFunc func(tx *sql.Tx, now int64) error

// do runs fn in a transaction (IMMEDIATE unless readOnly) and commits it,
// retrying busy transactions under the policy of Options. It returns the
// raw error; callers classify it.
func (s *Store) do(ctx context.Context, readOnly bool, fn txFunc) (optimistic.Stats, error) {
	var st optimistic.Stats
	err := s.retry(ctx, &st, func() error {
		if !readOnly {
			select {
			case s.writer <- struct{}{}:
			case <-ctx.Done():
				return ctx.Err()
			}
			defer func() { <-s.writer }()
		}
		tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: readOnly})
		if err != nil {
			return err
		}
		// Read after BEGIN: a writer holds the lock, so the clock
		// agrees with the order in which transactions commit.
		if err := fn(tx, time.Now().UnixMilli()); err != nil {
			// Rollback's error adds nothing: on failure nothing was
			// committed either way.
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
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
