package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/credpool/credpool/internal/retry"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
)

var _ optimistic.Waiter = (*Store)(nil)

// Options configure a Store. A nil *Options means all defaults.
type Options struct {
	// Busy bounds the transactions retried in one call after SQLite
	// reported the database busy or locked, and the pauses between them. A
	// transaction already waiting in SQLite's busy handler finishes its
	// wait first. Its OnTry is the store's own (it counts Stats).
	//
	// default: retry.Policy's (10 retries, pauses from 1ms doubling to
	// 64ms, each with ±50% jitter, within 2s)
	Busy retry.Policy
}

// Store is the lease store on SQLite. It is safe for concurrent use, and
// several processes may use the same file at once.
type Store struct {
	db     *sqlitex.DB
	policy retry.Policy
	stmts  statements
	queue  optimistic.Queue
	closed atomic.Bool
	// born is when New made the Store, and wrote the time since it (plus
	// 1ns; 0 for never) when a grant, release or renewal last committed:
	// each changes a row, which shows the file took a write (see Nodes).
	born  time.Time
	wrote atomic.Int64
	// proven is how long such a commit spares Nodes its own write;
	// tests change it.
	proven time.Duration
}

// provenFor is how long a commit spares Nodes its own write: under load,
// a probe would queue behind every grant for the write lock.
const provenFor = time.Second

// New returns a Store over db, which must use the modernc.org/sqlite driver
// (open it with sqlitex.Open, or add _txlock=immediate to its DSN and
// sqlitex.Wrap it). Its writes queue on db's write gate, with those of the
// catalog and the request log sharing db (see "Locking" in the package
// doc). New creates or upgrades the store's lease_* tables under ctx; on a
// file whose schema is current it writes nothing, so a read-only file still
// serves Inspect. New prepares the statements of the hot path on db; Close
// releases them.
func New(ctx context.Context, db *sqlitex.DB, opts *Options) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlitestore: nil database")
	}
	s := &Store{db: db, born: time.Now(), proven: provenFor}
	if opts != nil {
		s.policy = opts.Busy
	}
	if err := sqlitex.Migrate(ctx, db.DB, schema, s.policy); err != nil {
		return nil, sqlitex.Classify(ctx, "open", err)
	}
	stmts, err := prepare(ctx, db.DB)
	if err != nil {
		return nil, sqlitex.Classify(ctx, "open", err)
	}
	s.stmts = stmts
	return s, nil
}

// Close releases the store's prepared statements; closing db releases them
// too. It leaves db open. Calls made after Close fail with ErrStore.
func (s *Store) Close() error {
	s.closed.Store(true)
	return s.stmts.close()
}

// errClosed is what a call made after Close gets.
var errClosed = fmt.Errorf("%w: sqlitestore: closed", optimistic.ErrStore)

// Await joins this process's line of callers waiting for a slot on
// keyIDs (see optimistic.Waiter). A release, clear-out or sync through
// this Store wakes the next caller at once; one made by another process
// sharing the file is seen at the next poll (optimistic.WaitPoll), or
// at FreeAt.
func (s *Store) Await(_ context.Context, keyIDs []string) (*optimistic.Place, error) {
	if err := optimistic.CheckKeyIDs(keyIDs...); err != nil {
		return nil, err
	}
	if s.closed.Load() {
		return nil, errClosed
	}
	return s.queue.Join(keyIDs), nil
}

// Waiting is the number of callers of this Store waiting for a slot.
func (s *Store) Waiting() int { return s.queue.Len() }

// Nodes checks that the file takes a write, as a grant does: it rewrites
// the one row of lease_probe in a write transaction, unless a grant,
// release or renewal of this Store committed within the last second. The
// store's one "server" is the file, reported with an empty Addr.
func (s *Store) Nodes(ctx context.Context) []optimistic.NodeHealth {
	if w := s.wrote.Load(); w != 0 && time.Since(s.born)-time.Duration(w) < s.proven {
		return []optimistic.NodeHealth{{}}
	}
	_, err := s.do(ctx, false, func(tx *sql.Tx, now int64) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO lease_probe (id, at) VALUES (1, ?)
			ON CONFLICT (id) DO UPDATE SET at = excluded.at`, now)
		return err
	})
	return []optimistic.NodeHealth{{Err: sqlitex.Classify(ctx, "probe", err)}}
}

// Ping checks that the file answers and holds the store's tables.
func (s *Store) Ping(ctx context.Context) error {
	if s.closed.Load() {
		return errClosed
	}
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM lease_schema`).Scan(&n)
	return sqlitex.Classify(ctx, "ping", err)
}

// do runs fn in a transaction, read-only or a write one on the db's gate
// (sqlitex.DB.Read, Write), and commits it, retrying busy transactions
// under the policy of Options. The Stats count transactions tried and those
// that found the file busy (the last one too, if the budget ran out on it),
// as the Redis store counts aborted EXECs. It returns the raw error;
// callers classify it.
func (s *Store) do(ctx context.Context, readOnly bool, fn sqlitex.TxFunc) (optimistic.Stats, error) {
	var st optimistic.Stats
	if s.closed.Load() {
		// The statements would be prepared again on every use.
		return st, errClosed
	}
	p := s.policy
	p.OnTry = func(err error) {
		st.Attempts++
		if sqlitex.Busy(err) {
			st.Conflicts++
		}
	}
	run := s.db.Write
	if readOnly {
		run = s.db.Read
	}
	err := run(ctx, p, fn)
	return st, err
}

// changed notes that a transaction that changed a row just committed. A
// commit that changed nothing shows nothing: SQLite writes no page for it.
func (s *Store) changed() { s.wrote.Store(int64(time.Since(s.born)) + 1) }

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
