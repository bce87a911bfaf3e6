package broker

import (
	"context"
	"errors"
	"time"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/optimistic"
)

// AdminCatalog is what key administration needs from the catalog.
type AdminCatalog interface {
	Put(ctx context.Context, k catalog.Key) (catalog.Key, error)
	// Update changes some fields of a key, never its secret.
	Update(ctx context.Context, id string, p catalog.Patch) (catalog.Key, error)
	// PutMany writes every key or none, in one transaction.
	PutMany(ctx context.Context, keys ...catalog.Key) ([]catalog.Key, error)
	// Key reads a key without its secret.
	Key(ctx context.Context, id string) (catalog.Key, error)
	List(ctx context.Context, provider, pool string) ([]catalog.Key, error)
	Delete(ctx context.Context, id string) error
	// Lift ends a key's quarantine; it reports whether there was one.
	Lift(ctx context.Context, id string, now time.Time) (bool, error)
	SetAlias(ctx context.Context, provider, alias, model string) error
	DeleteAlias(ctx context.Context, provider, alias string) error
	Aliases(ctx context.Context) ([]catalog.Alias, error)
	Ping(ctx context.Context) error
	Quarantined(ctx context.Context, now time.Time) (int, time.Time, error)
	syncCatalog
}

// Admin manages keys: the catalog first (the source of truth), then the
// store. It is safe for concurrent use.
type Admin struct {
	syncer[AdminCatalog]
}

// NewAdmin returns an Admin over a catalog and a lease store. Of opts it
// uses MaxLease, Losses, StoreID and Logger: give it the Broker's.
func NewAdmin(c AdminCatalog, s optimistic.LeaseStore, opts *Options) *Admin {
	return &Admin{newSyncer(c, s, opts.withDefaults())}
}

// KeyView is a key as an operator sees it: catalog fields and live state,
// never the secret.
type KeyView struct {
	catalog.Key
	// Live counts unexpired leases; FreeAt is when the key can next grant
	// (zero: never by itself). Both come from the store.
	Live   int
	FreeAt time.Time
	// InStore is false if the store has no state for the key (sync needed).
	InStore bool
	// HeldUntil is when a key held back for leases a lease store lost
	// takes leases again: the later of the catalog's quarantine and the
	// store's own hold (optimistic.KeyInfo.HeldUntil). Zero if not held.
	HeldUntil time.Time
}

// Put upserts a key in the catalog, then syncs its allocation state to the
// store: a key the store lost is quarantined (see Options.MaxLease), and
// the key returned says so. If the store fails, the catalog keeps the
// change and the error says so; a later Sync repairs the store. A key
// deleted meanwhile is returned as stored, and not written to the store.
func (a *Admin) Put(ctx context.Context, k catalog.Key) (catalog.Key, error) {
	stored, err := a.catalog.Put(ctx, k)
	if err != nil {
		return catalog.Key{}, catalogErr(ctx, "put key", err)
	}
	return a.resync(ctx, stored)
}

// Update changes the fields p sets of key id in the catalog (never its
// secret), then syncs its allocation state to the store, as Put does:
// once it returns, a key disabled by it takes no new lease.
func (a *Admin) Update(ctx context.Context, id string, p catalog.Patch) (catalog.Key, error) {
	stored, err := a.catalog.Update(ctx, id, p)
	if err != nil {
		return catalog.Key{}, catalogErr(ctx, "update key", err)
	}
	return a.resync(ctx, stored)
}

// PutMany is Put for several keys: the catalog checks every key, then
// writes them all in one transaction (on failure none is written); then
// they are synced to the store as Sync does, with one read of the store
// and one of the catalog for all of them. Keys the store lost are
// quarantined; keys on a store server that does not answer or take
// writes are skipped
// and logged, for a later sync; the others go in one write if the store
// takes many keys at once (the SQLite store: one transaction). It returns the keys as the catalog
// stored them. If the store fails, the catalog keeps every key and the
// error says so; a later Sync repairs the store.
func (a *Admin) PutMany(ctx context.Context, keys ...catalog.Key) ([]catalog.Key, error) {
	stored, err := a.catalog.PutMany(ctx, keys...)
	if err != nil {
		return nil, catalogErr(ctx, "put keys", err)
	}
	infos, err := a.store.Inspect(ctx, ids(stored)...)
	if err != nil {
		return stored, err
	}
	if _, err := a.syncAll(ctx, stored, infos); err != nil {
		return stored, err
	}
	return stored, nil
}

// Keys lists every key with its live state (one store round trip),
// without secrets.
func (a *Admin) Keys(ctx context.Context) ([]KeyView, error) {
	keys, err := a.catalog.List(ctx, "", "")
	if err != nil {
		return nil, catalogErr(ctx, "list keys", err)
	}
	return a.views(ctx, keys...)
}

// Key returns one key with its live state; catalog.ErrNotFound if absent.
func (a *Admin) Key(ctx context.Context, id string) (KeyView, error) {
	k, err := a.catalog.Key(ctx, id)
	if err != nil {
		return KeyView{}, catalogErr(ctx, "get key", err)
	}
	v, err := a.views(ctx, k)
	if err != nil {
		return KeyView{}, err
	}
	return v[0], nil
}

func (a *Admin) views(ctx context.Context, keys ...catalog.Key) ([]KeyView, error) {
	infos, err := a.store.Inspect(ctx, ids(keys)...)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	out := make([]KeyView, len(keys))
	for i, k := range keys {
		k.Secret = ""
		// The catalog writes the last use behind; the store has the last
		// grant.
		k.LastUsedAt = later(k.LastUsedAt, infos[i].LastUsedAt)
		out[i] = KeyView{Key: k, Live: infos[i].Live, FreeAt: infos[i].FreeAt, InStore: infos[i].Exists,
			HeldUntil: heldUntil(k, infos[i], now)}
	}
	return out, nil
}

// heldUntil is when k, whose store state is in, takes leases again after
// a hold for lost leases; zero if it is not held at now.
func heldUntil(k catalog.Key, in optimistic.KeyInfo, now time.Time) time.Time {
	var until time.Time
	if k.QuarantineUntil.After(now) {
		until = k.QuarantineUntil
	}
	if in.HeldUntil.After(now) && in.HeldUntil.After(until) {
		until = in.HeldUntil
	}
	return until
}

// Delete removes the key from the catalog and every trace of it from the
// store; its leases are lost. catalog.ErrNotFound if neither had it: a key
// only the store had (a delete that reached the catalog but not the
// store, sent again) is deleted there, and that is a success.
func (a *Admin) Delete(ctx context.Context, id string) error {
	if err := optimistic.CheckKeyIDs(id); err != nil {
		return err
	}
	err := a.catalog.Delete(ctx, id)
	if err != nil && !errors.Is(err, catalog.ErrNotFound) {
		return catalogErr(ctx, "delete key", err)
	}
	if errors.Is(err, catalog.ErrNotFound) {
		// Perhaps a retry of a delete the store failed: what is left of
		// the key there is the key, and its delete succeeds.
		if in, ierr := a.store.Inspect(ctx, id); ierr == nil && len(in) == 1 && in[0].Exists {
			err = nil
		}
	}
	if serr := a.store.DeleteKey(ctx, id); serr != nil {
		return serr
	}
	return err
}

// ClearLeases force-releases every lease of the key, and returns how many
// it released; catalog.ErrNotFound if it released none and the catalog has
// no such key. It is the operator's word that none of the key's leases is
// in use, so it also lifts a quarantine (a hold for leases the store lost,
// or another store granted) and syncs the key: it grants again at once,
// unless the store itself holds it back (see optimistic.Options.LostHold).
// Leases of a key gone from the catalog are cleared too.
func (a *Admin) ClearLeases(ctx context.Context, id string) (int, error) {
	n, err := a.store.ClearLeases(ctx, id)
	if err != nil {
		return 0, err
	}
	lifted, err := a.catalog.Lift(ctx, id, time.Now())
	switch {
	case errors.Is(err, catalog.ErrNotFound) && n > 0:
		return n, nil
	case err != nil:
		return n, catalogErr(ctx, "lift quarantine", err)
	case lifted:
		k, err := a.catalog.Key(ctx, id)
		if errors.Is(err, catalog.ErrNotFound) {
			return n, nil
		}
		if err != nil {
			return n, catalogErr(ctx, "get key", err)
		}
		_, err = a.resync(ctx, k)
		return n, err
	}
	return n, nil
}

// Sync rewrites the store's state of every catalog key and returns how
// many were synced; keys the store lost are quarantined (see
// Options.MaxLease). Keys deleted from the catalog behind the store's back
// are not found by it; delete them through Delete.
func (a *Admin) Sync(ctx context.Context) (int, error) {
	keys, err := a.catalog.List(ctx, "", "")
	if err != nil {
		return 0, catalogErr(ctx, "list keys", err)
	}
	infos, err := a.store.Inspect(ctx, ids(keys)...)
	if err != nil {
		return 0, err
	}
	return a.syncAll(ctx, keys, infos)
}

// Losses reports the keys held back after the store lost them (every
// instance's findings, from the catalog) and how many this process found.
func (a *Admin) Losses(ctx context.Context) (LossReport, error) {
	n, until, err := a.catalog.Quarantined(ctx, time.Now())
	if err != nil {
		return LossReport{}, catalogErr(ctx, "count quarantined keys", err)
	}
	return LossReport{Held: n, Until: until, Total: a.losses.total.Load()}, nil
}

// SetAlias makes alias name model for the provider's requests.
func (a *Admin) SetAlias(ctx context.Context, provider, alias, model string) error {
	return catalogErr(ctx, "set alias", a.catalog.SetAlias(ctx, provider, alias, model))
}

// DeleteAlias removes the provider's alias; catalog.ErrAliasNotFound if
// there is none.
func (a *Admin) DeleteAlias(ctx context.Context, provider, alias string) error {
	return catalogErr(ctx, "delete alias", a.catalog.DeleteAlias(ctx, provider, alias))
}

// Aliases returns every alias, by provider then name.
func (a *Admin) Aliases(ctx context.Context) ([]catalog.Alias, error) {
	all, err := a.catalog.Aliases(ctx)
	return all, catalogErr(ctx, "list aliases", err)
}

// Ready reports whether the catalog and the store answer.
func (a *Admin) Ready(ctx context.Context) error {
	if err := a.catalog.Ping(ctx); err != nil {
		return catalogErr(ctx, "ping", err)
	}
	return a.store.Ping(ctx)
}
