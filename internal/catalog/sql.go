package catalog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/credpool/credpool/internal/postgres"
	"github.com/credpool/credpool/internal/sqlitex"
)

// SQL is the catalog on a database/sql database: SQLite (New, the
// embedded default) or PostgreSQL (NewPostgres, shared by hosts). It is
// safe for concurrent use, and by several processes sharing one database.
// Every method is one statement or one transaction: on failure nothing is
// written.
//
// The SQL is written once for both engines (engine.go has what differs:
// placeholders, transactions, the migration runner). Write transactions
// start with a write, the generation row (see write), so that SQLite takes
// its write lock up front and PostgreSQL orders the writers on that row.
//
// Errors: ErrNotFound for a missing key, optimistic.ErrInvalid (naming the
// field) for a rejected argument, optimistic.ErrContended when the database
// stayed locked (SQLite) or kept aborting for lost races (PostgreSQL)
// through the retries, optimistic.ErrStore for any other database failure,
// and the context's error when ctx ends first. None carries a secret.
type SQL struct {
	db      *engine
	sealer  *Sealer
	history history
	// writes counts this process's write transactions, committed or not
	// (a commit's reply may be lost): a Cache on s checks the generation
	// again after one.
	writes atomic.Int64
}

// Options configure a catalog. A nil *Options means all defaults.
type Options struct {
	// Sealer encrypts secrets at rest; every process sharing the database
	// needs a Sealer that opens what the others seal.
	//
	// default: nil, secrets stored as given (tests and tools; credpool
	// serve always sets one)
	Sealer *Sealer
}

// New returns the catalog on the SQLite database db after migrating its
// schema to the latest version (tables catalog_schema, catalog_keys,
// catalog_key_models, catalog_model_aliases, catalog_reports,
// catalog_generation, catalog_generations, catalog_tombstones). Migrating
// is idempotent and safe when several processes start at once; a failed
// migration leaves the previous version. Its writes queue on db's write
// gate, with those of every other user of db in this process.
func New(ctx context.Context, db *sqlitex.DB, opts *Options) (*SQL, error) {
	if db == nil {
		return nil, errors.New("catalog: nil database")
	}
	if err := sqlitex.Migrate(ctx, db.DB, schema, busyPolicy); err != nil {
		return nil, fail(ctx, "open", err)
	}
	return newSQL(sqliteEngine(db), opts), nil
}

// NewPostgres is New on a PostgreSQL database: the same tables, migrated
// the same way (postgres.Migrate), for catalogs that several hosts share.
func NewPostgres(ctx context.Context, db *postgres.DB, opts *Options) (*SQL, error) {
	if db == nil {
		return nil, errors.New("catalog: nil database")
	}
	if err := postgres.Migrate(ctx, db, schema.Table, postgresSteps(), busyPolicy); err != nil {
		return nil, fail(ctx, "open", err)
	}
	return newSQL(postgresEngine(db), opts), nil
}

func newSQL(e *engine, opts *Options) *SQL {
	s := &SQL{db: e, history: defaultHistory}
	if opts != nil {
		s.sealer = opts.Sealer
	}
	return s
}

// Ping checks that the catalog's database answers and holds its schema.
func (s *SQL) Ping(ctx context.Context) error {
	var version int
	if err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM catalog_schema`).Scan(&version); err != nil {
		return fail(ctx, "ping", err)
	}
	return nil
}

const upsertKey = `INSERT INTO catalog_keys (
	id, provider, pool, secret, status, cooldown_until, max_concurrent_uses,
	last_used_at, last_verified_at, successes, errors, rate_limit_hits, created_at, updated_at, gen
) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET
	provider = excluded.provider,
	pool = excluded.pool,
	secret = excluded.secret,
	status = excluded.status,
	cooldown_until = excluded.cooldown_until,
	max_concurrent_uses = excluded.max_concurrent_uses,
	last_used_at = COALESCE(excluded.last_used_at, catalog_keys.last_used_at),
	last_verified_at = COALESCE(excluded.last_verified_at, catalog_keys.last_verified_at),
	successes = CASE WHEN excluded.successes = 0 THEN catalog_keys.successes ELSE excluded.successes END,
	errors = CASE WHEN excluded.errors = 0 THEN catalog_keys.errors ELSE excluded.errors END,
	rate_limit_hits = CASE WHEN excluded.rate_limit_hits = 0 THEN catalog_keys.rate_limit_hits ELSE excluded.rate_limit_hits END,
	created_at = COALESCE(?, catalog_keys.created_at),
	updated_at = excluded.updated_at,
	gen = excluded.gen`

// Put creates or replaces the key with k's id and returns it as stored,
// without its secret: models sorted and deduplicated, times truncated to
// milliseconds.
//
// Status, cooldown, limit, pool, models and secret are always taken from k.
// Of an existing key, the counters, LastUsedAt, LastVerifiedAt and
// CreatedAt are kept unless k sets them non-zero, so an admin upsert does
// not wipe the key's history. UpdatedAt is set to now.
func (s *SQL) Put(ctx context.Context, k Key) (Key, error) {
	stored, err := s.PutMany(ctx, k)
	if err != nil {
		return Key{}, err
	}
	return stored[0], nil
}

// PutMany is Put for several keys in one transaction: every key is checked
// before any is written, and either all are written or none. A rejected
// key's error names its id.
func (s *SQL) PutMany(ctx context.Context, keys ...Key) ([]Key, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	rows := make([]putRow, len(keys))
	now := time.Now().UnixMilli()
	for i, k := range keys {
		if err := validate(k); err != nil {
			if len(keys) > 1 {
				err = fmt.Errorf("key %q: %w", k.ID, err)
			}
			return nil, err
		}
		k.Models = slices.Compact(slices.Sorted(slices.Values(k.Models)))
		rows[i] = putRow{k: k, secret: k.Secret.Reveal()}
		if s.sealer != nil {
			var err error
			if rows[i].secret, err = s.sealer.seal(k.ID, rows[i].secret); err != nil {
				return nil, fail(ctx, "put key "+k.ID, err)
			}
		}
	}
	op := "put keys"
	if len(keys) == 1 {
		op = "put key " + keys[0].ID
	}
	var stored []Key
	err := s.write(ctx, op, func(tx txn, gen int64) error {
		if err := s.checkKey(ctx, tx); err != nil {
			return err
		}
		for _, r := range rows {
			if err := r.put(ctx, tx, gen, now); err != nil {
				return err
			}
		}
		// The rows this transaction stamped are exactly these keys.
		byID, err := queryKeys(ctx, tx, false, `WHERE k.gen = ?`, gen)
		if err != nil {
			return err
		}
		stored = make([]Key, len(rows))
		for i, r := range rows {
			j, ok := slices.BinarySearchFunc(byID, r.k.ID, func(k Key, id string) int { return strings.Compare(k.ID, id) })
			if !ok {
				return notFound(r.k.ID)
			}
			stored[i] = byID[j]
		}
		return nil
	})
	return stored, err
}

// putRow is one key for PutMany, its secret as stored.
type putRow struct {
	k      Key
	secret string
}

func (r putRow) put(ctx context.Context, tx txn, gen, now int64) error {
	k := r.k
	// created is NULL unless k sets it: an update then keeps the stored one.
	created, insertCreated := millis(k.CreatedAt), any(now)
	if created != nil {
		insertCreated = created
	}
	if _, err := tx.ExecContext(ctx, upsertKey,
		k.ID, k.Provider, k.Pool, r.secret, string(k.Status), millis(k.CooldownUntil), k.MaxConcurrentUses,
		millis(k.LastUsedAt), millis(k.LastVerifiedAt), k.Successes, k.Errors, k.RateLimitHits,
		insertCreated, now, gen, created,
	); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM catalog_key_models WHERE key_id = ?`, k.ID); err != nil {
		return err
	}
	for _, m := range k.Models {
		if _, err := tx.ExecContext(ctx, `INSERT INTO catalog_key_models (key_id, model) VALUES (?, ?)`, k.ID, m); err != nil {
			return err
		}
	}
	return nil
}

// Get returns the key, secret included (opened with the Sealer), or
// ErrNotFound.
func (s *SQL) Get(ctx context.Context, id string) (Key, error) {
	k, err := getKey(ctx, s.db, id, true)
	if err == nil && s.sealer != nil {
		var plain string
		plain, err = s.sealer.open(k.ID, k.Secret.Reveal())
		k.Secret = Secret(plain)
	}
	if err != nil {
		return Key{}, fail(ctx, fmt.Sprintf("get key %q", id), err)
	}
	return k, nil
}

// Key returns the key without its secret, or ErrNotFound: Get for callers
// that only check a key's state, so the secret is neither read nor opened.
func (s *SQL) Key(ctx context.Context, id string) (Key, error) {
	k, err := getKey(ctx, s.db, id, false)
	if err != nil {
		return Key{}, fail(ctx, fmt.Sprintf("get key %q", id), err)
	}
	return k, nil
}

// Rekey seals with the Sealer's current key every secret that is not
// sealed with it yet: plaintext ones written before sealing, and ones
// sealed with a key being rotated out. It is one transaction and returns
// how many it sealed. A secret it cannot open (sealed with a key the Sealer
// no longer has, tampered with, or plaintext that looks sealed) is left as
// it is, and its key's id is returned in skipped, in id order: Get keeps
// failing on that key alone. But if the catalog holds sealed secrets and
// not one was sealed with a key the Sealer has, Rekey writes nothing and
// returns ErrWrongKey: it was given the wrong key, and would seal the
// plaintext ones with it. See the README for rotating keys across
// processes.
func (s *SQL) Rekey(ctx context.Context) (sealed int, skipped []string, err error) {
	if s.sealer == nil {
		return 0, nil, errors.New("catalog: rekey: no sealer")
	}
	wrongKey := false
	err = s.write(ctx, "rekey secrets", func(tx txn, gen int64) error {
		sealed, skipped = 0, nil
		all, err := secrets(ctx, tx)
		if err != nil {
			return err
		}
		if wrongKey = s.sealer.foreign(all); wrongKey {
			return errUnchanged
		}
		for _, row := range all {
			if s.sealer.fresh(row.secret) {
				continue
			}
			plain, err := s.sealer.open(row.id, row.secret)
			if err != nil {
				skipped = append(skipped, row.id)
				continue
			}
			resealed, err := s.sealer.seal(row.id, plain)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `UPDATE catalog_keys SET secret = ?, gen = ? WHERE id = ?`, resealed, gen, row.id); err != nil {
				return err
			}
			sealed++
		}
		if sealed == 0 {
			return errUnchanged
		}
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	if wrongKey {
		return 0, nil, ErrWrongKey
	}
	if sealed > 0 && !s.db.postgres {
		// Best effort: move the rewritten pages into the file and empty
		// SQLite's WAL, which still holds the old values (readers may keep
		// it).
		_, _ = s.db.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`)
	}
	return sealed, skipped, nil
}

// checkKey refuses, with ErrWrongKey, to seal a secret into a catalog
// that holds sealed secrets and not one under a key the Sealer has (see
// Rekey): an instance given the wrong key would otherwise add secrets the
// others cannot open, and then pass its own start's check.
func (s *SQL) checkKey(ctx context.Context, tx txn) error {
	if s.sealer == nil {
		return nil
	}
	// Usually a secret under one of its keys comes first: no full read.
	for tag := range s.sealer.keys {
		var one int
		err := tx.QueryRowContext(ctx, `SELECT 1 FROM catalog_keys WHERE secret LIKE ? LIMIT 1`, sealedPrefix+tag+":%").Scan(&one)
		if err == nil {
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
	}
	all, err := secrets(ctx, tx)
	if err != nil {
		return err
	}
	if s.sealer.foreign(all) {
		return ErrWrongKey
	}
	return nil
}

// storedSecret is one row's secret as stored.
type storedSecret struct{ id, secret string }

// secrets reads every key's secret as stored, in id order.
func secrets(ctx context.Context, tx txn) ([]storedSecret, error) {
	rows, err := tx.QueryContext(ctx, `SELECT id, secret FROM catalog_keys ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storedSecret
	for rows.Next() {
		var r storedSecret
		if err := rows.Scan(&r.id, &r.secret); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// List returns the keys of provider and pool, ordered by id; "" matches
// any provider or pool. It leaves every Secret empty: ranking and listing
// never need one. (A Cache holds the secrets as stored, apart from the
// keys it lists, and opens only the one Get hands out.)
func (s *SQL) List(ctx context.Context, provider, pool string) ([]Key, error) {
	where, args := keyFilter(provider, pool)
	keys, err := queryKeys(ctx, s.db, false, whereClause(where), args...)
	if err != nil {
		return nil, fail(ctx, "list keys", err)
	}
	return keys, nil
}

// Delete removes the key and its models, or returns ErrNotFound. It leaves
// a tombstone for Caches to see.
func (s *SQL) Delete(ctx context.Context, id string) error {
	return s.write(ctx, fmt.Sprintf("delete key %q", id), func(tx txn, gen int64) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM catalog_keys WHERE id = ?`, id)
		if err := found(res, err, id); err != nil {
			return err
		}
		if _, err = tx.ExecContext(ctx, `DELETE FROM catalog_key_models WHERE key_id = ?`, id); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO catalog_tombstones (key_id, gen) VALUES (?, ?)`, id, gen)
		return err
	})
}

// selectKeys yields one row per key and model (one with a NULL model for a
// key without models), ordered so that a key's rows are adjacent: one
// statement, so one consistent snapshot. The secret column is filled in by
// queryKeys.
const selectKeys = `SELECT
	k.id, k.provider, k.pool, %s, k.status, k.cooldown_until, k.max_concurrent_uses,
	k.last_used_at, k.last_verified_at, k.successes, k.errors, k.rate_limit_hits,
	k.created_at, k.updated_at, k.synced_at, COALESCE(k.synced_store, ''), k.quarantine_until, m.model
FROM catalog_keys k LEFT JOIN catalog_key_models m ON m.key_id = k.id `

// queryer is what engine and txn share for reads.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// queryKeys reads the keys matching where; their secrets only if
// withSecret.
func queryKeys(ctx context.Context, q queryer, withSecret bool, where string, args ...any) ([]Key, error) {
	secret := `''`
	if withSecret {
		secret = `k.secret`
	}
	rows, err := q.QueryContext(ctx, fmt.Sprintf(selectKeys, secret)+where+` ORDER BY k.id, m.model`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var keys []Key
	for rows.Next() {
		var (
			k                                            Key
			cooldown, used, verified, synced, quarantine sql.NullInt64
			created, updated                             int64
			model                                        sql.NullString
		)
		if err := rows.Scan(&k.ID, &k.Provider, &k.Pool, &k.Secret, &k.Status, &cooldown, &k.MaxConcurrentUses,
			&used, &verified, &k.Successes, &k.Errors, &k.RateLimitHits, &created, &updated, &synced, &k.SyncedStore, &quarantine, &model); err != nil {
			return nil, err
		}
		if n := len(keys); n == 0 || keys[n-1].ID != k.ID {
			k.CooldownUntil, k.LastUsedAt, k.LastVerifiedAt = fromMillis(cooldown), fromMillis(used), fromMillis(verified)
			k.SyncedAt, k.QuarantineUntil = fromMillis(synced), fromMillis(quarantine)
			k.CreatedAt, k.UpdatedAt = time.UnixMilli(created).UTC(), time.UnixMilli(updated).UTC()
			keys = append(keys, k)
		}
		if model.Valid {
			last := &keys[len(keys)-1]
			last.Models = append(last.Models, model.String)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// Byte order, as Go compares: PostgreSQL's ORDER BY follows the
	// database's collation, which may not.
	slices.SortFunc(keys, func(a, b Key) int { return strings.Compare(a.ID, b.ID) })
	for _, k := range keys {
		slices.Sort(k.Models)
	}
	return keys, nil
}

func getKey(ctx context.Context, q queryer, id string, withSecret bool) (Key, error) {
	keys, err := queryKeys(ctx, q, withSecret, `WHERE k.id = ?`, id)
	if err != nil {
		return Key{}, err
	}
	if len(keys) == 0 {
		return Key{}, notFound(id)
	}
	return keys[0], nil
}

// keyFilter matches provider and pool, skipping the empty ones.
func keyFilter(provider, pool string) (where []string, args []any) {
	if provider != "" {
		where, args = append(where, `k.provider = ?`), append(args, provider)
	}
	if pool != "" {
		where, args = append(where, `k.pool = ?`), append(args, pool)
	}
	return where, args
}

func whereClause(conds []string) string {
	if len(conds) == 0 {
		return ""
	}
	return `WHERE ` + strings.Join(conds, ` AND `) + ` `
}

func notFound(id string) error { return fmt.Errorf("%w: %q", ErrNotFound, id) }

// found turns an UPDATE or DELETE that matched no row into ErrNotFound.
func found(res sql.Result, err error, id string) error {
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return notFound(id)
	}
	return nil
}

// millis is t in unix milliseconds, or NULL for the zero time.
func millis(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMilli()
}

func fromMillis(ms sql.NullInt64) time.Time {
	if !ms.Valid {
		return time.Time{}
	}
	return time.UnixMilli(ms.Int64).UTC()
}
