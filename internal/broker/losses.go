package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/optimistic"
)

// DefaultMaxLease is the longest lease the service grants or renews to when
// Options.MaxLease is not set.
const DefaultMaxLease = time.Hour

// Losses counts the keys this process found lost from the lease store,
// for the metrics. It is safe for concurrent use; a Broker and its Admin
// share one. Which keys are held back now is the catalog's to say (it
// keeps each quarantine), so every instance agrees on it.
type Losses struct {
	total atomic.Int64

	mu sync.Mutex
	// mirrored holds, by key id, the end (ms) of the last store hold
	// this process quarantined the key for, or is quarantining it for
	// (see poolRun.mirror): concurrent allocates that read the same hold
	// quarantine and count it once.
	mirrored map[string]int64
}

// NewLosses returns a zero counter.
func NewLosses() *Losses { return &Losses{mirrored: map[string]int64{}} }

// claim reports whether the caller is the first of this process to
// quarantine keyID for a store hold until until (ms), or a later one.
func (l *Losses) claim(keyID string, until int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mirrored[keyID] >= until {
		return false
	}
	l.mirrored[keyID] = until
	return true
}

// unclaim undoes a claim whose quarantine failed, so the next read of
// the hold tries again.
func (l *Losses) unclaim(keyID string, until int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mirrored[keyID] == until {
		delete(l.mirrored, keyID)
	}
}

// LossReport says which keys the store lost are held back.
type LossReport struct {
	// Held is the number of keys held back now; Until is when the last of
	// them takes leases again.
	Held  int
	Until time.Time
	// Total counts the keys this process found lost since it started.
	Total int64
}

// syncCatalog is what syncing a key needs from the catalog.
type syncCatalog interface {
	Key(ctx context.Context, id string) (catalog.Key, error)
	List(ctx context.Context, provider, pool string) ([]catalog.Key, error)
	MarkSynced(ctx context.Context, store string, at time.Time, ids ...string) error
	Quarantine(ctx context.Context, id string, until, now time.Time) (catalog.Key, error)
}

// keysSyncer is a lease store that writes many keys' states at once, all
// or none (the SQLite store: one transaction, so one write to disk, where
// SyncKey for each would make one per key). A store whose keys live on
// several servers, one of which may not answer, must not be one: syncAll
// skips such keys one by one.
type keysSyncer interface {
	SyncKeys(ctx context.Context, keys ...optimistic.KeyState) error
}

// syncer brings a key's state from the catalog into the store, and tells a
// key the store lost from one it never had. The Broker and the Admin embed
// one over their own catalogs.
type syncer[C syncCatalog] struct {
	catalog  C
	store    optimistic.LeaseStore
	ids      *StoreID // the store's names in the catalog's synced records
	losses   *Losses
	maxLease time.Duration
	log      *slog.Logger
}

func newSyncer[C syncCatalog](c C, s optimistic.LeaseStore, o Options) syncer[C] {
	return syncer[C]{catalog: c, store: s, ids: o.StoreID, losses: o.Losses, maxLease: o.MaxLease, log: o.Logger}
}

// sync writes k, as the catalog has it, into the store, whose view of it is
// in, read after k: another broker may have synced the key meanwhile, and
// since it syncs before it marks the key synced, a store read after k sees
// that sync. If the store lost leases of the key, or another store may
// have granted leases on it (see lostUntil), they may still be in use, so
// the key is quarantined (held back until they end, in the catalog and so
// in the store) rather than handed out again at once; a key another store
// served is then marked as this store's, so the hold is taken once. It
// returns the key as synced and whether it was found lost. A key deleted
// from the catalog meanwhile is catalog.ErrNotFound.
func (s syncer[C]) sync(ctx context.Context, k catalog.Key, in optimistic.KeyInfo) (catalog.Key, bool, error) {
	moved, err := s.moved(ctx, k, in)
	if err != nil {
		return k, false, err
	}
	from, now := k.SyncedStore, time.Now()
	until, lost := s.lostUntil(k, in, moved, now)
	if lost {
		q, err := s.catalog.Quarantine(ctx, k.ID, until, now)
		if err != nil {
			return k, false, catalogErr(ctx, "quarantine", err)
		}
		q.Secret = k.Secret
		k = q
	}
	k, err = s.write(ctx, k)
	if err != nil {
		return k, false, err
	}
	k, err = s.mark(ctx, k, now)
	if err != nil || !lost {
		return k, false, err
	}
	s.losses.total.Add(1)
	msg, how := "the lease store lost this key's state", "the key is missing"
	switch {
	case moved:
		msg, how = "the key was served by another lease store", "lease store "+from+" synced it last, and its leases may be in use"
		if !in.Exists {
			how += " (a move to this store, or this store lost its data, its id too, before any instance here noticed)"
		}
	case in.Exists:
		how = "its state is older than a grant seen on it"
	}
	s.log.WarnContext(ctx, msg+": no grants on it until every lease it may have had has ended",
		"key_id", k.ID, "how", how, "until", k.QuarantineUntil)
	return k, true, nil
}

// mark records that k reached this store at now, if it had not (see
// first): a key deleted from the catalog meanwhile is left as it is.
func (s syncer[C]) mark(ctx context.Context, k catalog.Key, now time.Time) (catalog.Key, error) {
	if !s.first(k) {
		return k, nil
	}
	id := s.ids.mark()
	err := s.catalog.MarkSynced(ctx, id, now, k.ID)
	if err != nil && !errors.Is(err, catalog.ErrNotFound) {
		return k, catalogErr(ctx, "mark synced", err)
	}
	k.SyncedAt, k.SyncedStore = now, id
	return k, nil
}

// moved reports whether k, which the store's view in shows, was last
// synced to another lease store, whose grants this one does not know of.
// Before it says so, it reads the store's id again (see StoreID.reread):
// another instance may have written a new one after the store lost its
// data. A key the store lacks has the id read again too, so that a store
// that lost its data, id and all, gets its id back before an instance
// starting now writes another; that read failing is no error there, as
// such a key is held back anyway. While the id is unread, every sync and
// grant tries to read it (once a second at most).
func (s syncer[C]) moved(ctx context.Context, k catalog.Key, in optimistic.KeyInfo) (bool, error) {
	if _, known := s.ids.ID(); !known && s.ids.reread(ctx) != nil {
		return false, nil // unread still: every name is this store's
	}
	if k.SyncedAt.IsZero() || in.Unreachable || (in.Exists && s.ids.owns(k.SyncedStore)) {
		return false, nil
	}
	switch err := s.ids.reread(ctx); {
	case err == nil:
	case !in.Exists || s.ids.owns(k.SyncedStore):
		// A key the store lacks is held back either way.
		s.log.WarnContext(ctx, "the lease store lacks a key or a name; its id was not read again", "key_id", k.ID, "err", err)
	default:
		return false, err
	}
	return !s.ids.owns(k.SyncedStore), nil
}

// settleRounds bounds write's re-syncs of a key that keeps changing: its
// writers sync it themselves.
const settleRounds = 3

// write syncs k's state into the store, then reads the key again from the
// catalog and, if the catalog has moved on, syncs the newer state too.
// Every writer changes the catalog before it syncs the store, so a writer
// whose sync this one may have overwritten (it changed and synced the key
// between this caller's catalog read and this store write) is then not
// undone: whichever sync lands last was checked against the catalog after
// it landed, and the store never keeps a view older than the catalog's.
// A key deleted from the catalog meanwhile is deleted from the store
// again, as this write may have brought it back; that is
// catalog.ErrNotFound.
func (s syncer[C]) write(ctx context.Context, k catalog.Key) (catalog.Key, error) {
	for range settleRounds {
		if err := s.store.SyncKey(ctx, k.LeaseState()); err != nil {
			return k, err
		}
		fresh, err := s.catalog.Key(ctx, k.ID)
		if errors.Is(err, catalog.ErrNotFound) {
			if err := s.store.DeleteKey(ctx, k.ID); err != nil {
				return k, err
			}
			return k, err
		}
		if err != nil {
			return k, catalogErr(ctx, "sync check", err)
		}
		if sameState(fresh, k) {
			return k, nil
		}
		fresh.Secret = k.Secret
		k = fresh
	}
	return k, nil
}

// sameState reports whether a and b put the same state into the store:
// the last use, which only seeds a missing one and is written behind, is
// left out.
func sameState(a, b catalog.Key) bool {
	x, y := a.LeaseState(), b.LeaseState()
	return x.ID == y.ID && x.Provider == y.Provider && x.Pool == y.Pool && x.Status == y.Status &&
		x.CooldownUntil.Equal(y.CooldownUntil) && x.MaxConcurrentUses == y.MaxConcurrentUses && x.Score == y.Score
}

// lostUntil reports whether the store lost leases of k, by in, and until
// when they may still be in use. Either it lacks k although k reached a
// store, this one or another (the service moved to this store, or an
// instance was pointed at another by mistake: leases granted there may be
// in use), or another store synced k after this one did (moved, see
// syncer.moved: it may have granted since, whatever this store holds):
// then for up to maxLease from now. A key the store could not read
// (in.Unreachable) is not known to be lacking. Or it holds k back, having
// found its state older than a grant it had seen (a restart from an older
// copy, see optimistic.Options.LostHold), longer than the catalog does:
// then until that hold ends.
func (s syncer[C]) lostUntil(k catalog.Key, in optimistic.KeyInfo, moved bool, now time.Time) (time.Time, bool) {
	switch {
	case moved, !in.Exists && !in.Unreachable && !k.SyncedAt.IsZero():
		return now.Add(s.maxLease), true
	case in.HeldUntil.After(now) && in.HeldUntil.After(k.QuarantineUntil):
		return in.HeldUntil, true
	}
	return time.Time{}, false
}

// first reports whether k has not reached this store before, as far as
// this process can tell: while the store's id is unread, only a key that
// reached no store (marked then with the empty name, see StoreID.mark).
func (s syncer[C]) first(k catalog.Key) bool {
	id, known := s.ids.ID()
	return k.SyncedAt.IsZero() || (known && k.SyncedStore != id)
}

// syncAll is sync for every key of keys, whose store state is infos: those
// that reach the store for the first time are marked in one catalog write,
// after all are synced. Keys the store cannot reach (a Redis Cluster
// master that is down) are skipped and logged, unless it reaches none: a
// later sync, or the repair of an allocate, brings them in. It returns how
// many it synced.
//
// The keys the store neither lost nor cannot reach are written after the
// lost ones (syncPlain).
func (s syncer[C]) syncAll(ctx context.Context, keys []catalog.Key, infos []optimistic.KeyInfo) (int, error) {
	now := time.Now()
	var (
		synced, plain []catalog.Key // plain: reachable, not lost
		skipped       []string
		down          error
	)
	for i, k := range keys {
		moved, err := s.moved(ctx, k, infos[i])
		if err != nil {
			return len(synced), err
		}
		_, lost := s.lostUntil(k, infos[i], moved, now)
		switch {
		case infos[i].Unreachable:
			skipped, down = append(skipped, k.ID), cmp.Or(down, fmt.Errorf("%w: %w: key %s", optimistic.ErrStore, optimistic.ErrUnreachable, k.ID))
		case lost:
			_, _, err := s.sync(ctx, k, infos[i])
			switch {
			case errors.Is(err, optimistic.ErrUnreachable):
				skipped, down = append(skipped, k.ID), cmp.Or(down, err)
			case err != nil && !errors.Is(err, catalog.ErrNotFound):
				return len(synced), err
			default:
				synced = append(synced, k)
			}
		default:
			plain = append(plain, k)
		}
	}
	done, unreached, unreachedErr, err := s.syncPlain(ctx, plain)
	synced = append(synced, done...)
	if err != nil {
		return len(synced), err
	}
	skipped, down = append(skipped, unreached...), cmp.Or(down, unreachedErr)
	var first []string
	for _, k := range done {
		if s.first(k) {
			first = append(first, k.ID)
		}
	}
	if len(skipped) > 0 {
		if len(synced) == 0 {
			return 0, down
		}
		s.log.WarnContext(ctx, "keys not synced: the lease store server holding them does not answer or take writes", "key_ids", skipped)
	}
	if err := s.settleAll(ctx, synced); err != nil {
		return len(synced), err
	}
	if err := s.catalog.MarkSynced(ctx, s.ids.mark(), now, first...); err != nil && !errors.Is(err, catalog.ErrNotFound) {
		return len(synced), catalogErr(ctx, "mark synced", err)
	}
	return len(synced), nil
}

// syncPlain writes keys, which the store neither lost nor failed to read,
// as they are: in one SyncKeys if the store is a keysSyncer, else key by
// key. It returns those it wrote, and those whose server did not answer
// with the first such error.
func (s syncer[C]) syncPlain(ctx context.Context, keys []catalog.Key) (done []catalog.Key, unreached []string, unreachedErr, err error) {
	if len(keys) == 0 {
		return nil, nil, nil, nil
	}
	if batcher, ok := s.store.(keysSyncer); ok {
		states := make([]optimistic.KeyState, len(keys))
		for i, k := range keys {
			states[i] = k.LeaseState()
		}
		if err := batcher.SyncKeys(ctx, states...); err != nil {
			return nil, nil, nil, err
		}
		return keys, nil, nil, nil
	}
	for _, k := range keys {
		switch err := s.store.SyncKey(ctx, k.LeaseState()); {
		case errors.Is(err, optimistic.ErrUnreachable):
			unreached, unreachedErr = append(unreached, k.ID), cmp.Or(unreachedErr, err)
		case err != nil:
			return done, unreached, unreachedErr, err
		default:
			done = append(done, k)
		}
	}
	return done, unreached, unreachedErr, nil
}

// settleAll is write's check for syncAll: one List after every key was
// synced, and write for each key whose state moved meanwhile, or
// DeleteKey for each deleted.
func (s syncer[C]) settleAll(ctx context.Context, synced []catalog.Key) error {
	now, err := s.catalog.List(ctx, "", "")
	if err != nil {
		return catalogErr(ctx, "sync check", err)
	}
	byID := make(map[string]catalog.Key, len(now))
	for _, k := range now {
		byID[k.ID] = k
	}
	for _, k := range synced {
		fresh, ok := byID[k.ID]
		switch {
		case !ok:
			err = s.store.DeleteKey(ctx, k.ID)
		case !sameState(fresh, k):
			_, err = s.write(ctx, fresh)
			if errors.Is(err, catalog.ErrNotFound) || errors.Is(err, optimistic.ErrUnreachable) {
				// Deleted meanwhile, or its server went away: the next
				// sync or repair brings it in.
				err = nil
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// resync is sync with a fresh read of the store, for a key read from (or
// just written to) the catalog. It returns the key as synced; a key
// deleted from the catalog meanwhile is no error, and is returned as given.
// A loss in the one round trip between that read and the write goes
// unnoticed (the write recreates the key); closing it would take a store
// write that never creates a key.
func (s syncer[C]) resync(ctx context.Context, k catalog.Key) (catalog.Key, error) {
	infos, err := s.store.Inspect(ctx, k.ID)
	if err != nil {
		return k, err
	}
	synced, _, err := s.sync(ctx, k, infos[0])
	if errors.Is(err, catalog.ErrNotFound) {
		return k, nil
	}
	return synced, err
}
