package broker_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/optimistic"
)

// elsewhere is e's catalog as another process has it, cached with opts:
// its writes are not this process's own.
func elsewhere(t *testing.T, e *env, opts *catalog.CacheOptions) *catalog.Cache {
	t.Helper()
	sql, err := catalog.New(t.Context(), e.db, nil)
	require.NoError(t, err)
	return cacheWith(t, sql, opts)
}

// trusting is elsewhere with a snapshot trusted for an hour: it reads the
// generation only where a request must.
func trusting(t *testing.T, e *env) *catalog.Cache {
	return elsewhere(t, e, &catalog.CacheOptions{MaxAge: time.Hour})
}

// A request starts from a recent snapshot, without a read of the
// generation, but does not answer "full" from it when the catalog moved
// since: a key another process added is granted at once.
func TestNoGrantAnsweredFromTheCurrentCatalog(t *testing.T) {
	e := newEnv(t, key("a", "default", 1))
	b := broker.New(trusting(t, e), e.store, &broker.Options{Logger: e.log})
	require.Equal(t, "a", allocate(t, b, req("default")).KeyID)

	other := broker.NewAdmin(elsewhere(t, e, nil), e.store, nil)
	_, err := other.Put(t.Context(), key("n", "default", 1))
	require.NoError(t, err)
	require.Equal(t, "n", allocate(t, b, req("default")).KeyID)
	_, err = b.Allocate(t.Context(), req("default"))
	capacityError(t, err)

	// No key at all, then one added elsewhere: not "no keys".
	_, err = b.Allocate(t.Context(), req("gold"))
	require.ErrorIs(t, err, broker.ErrNoCandidates)
	_, err = other.Put(t.Context(), key("g", "gold", 1))
	require.NoError(t, err)
	require.Equal(t, "g", allocate(t, b, req("gold")).KeyID)
}

// A grant on a model resolved through an alias that another process has
// moved since is given back, and the request served on the alias's new
// target.
func TestGrantFollowsAMovedAlias(t *testing.T) {
	old, moved := key("old", "default", 1), key("new", "default", 1)
	old.Models, moved.Models = []string{"m-old"}, []string{"m-new"}
	e := newEnv(t, old, moved)
	require.NoError(t, e.admin.SetAlias(t.Context(), provider, "m", "m-old"))
	b := broker.New(trusting(t, e), e.store, &broker.Options{Logger: e.log})
	r := req("default")
	r.Model = "m"
	g := allocate(t, b, r)
	require.Equal(t, "old", g.KeyID)
	require.NoError(t, b.Release(t.Context(), g.LeaseRef))

	other := broker.NewAdmin(elsewhere(t, e, nil), e.store, nil)
	require.NoError(t, other.SetAlias(t.Context(), provider, "m", "m-new"))
	g = allocate(t, b, r)
	require.Equal(t, "new", g.KeyID)
	require.Equal(t, "m-new", g.Model)
	require.Zero(t, e.live(t, "old"), "the grant on the old target was given back")
	require.Equal(t, optimistic.StatusAvailable, e.info(t, "old").Status)
}

// A request id served elsewhere after an alias moved is replayed here,
// not refused as reused for another model: a request with an id resolves
// its model on the current catalog.
func TestRequestIDFollowsAMovedAlias(t *testing.T) {
	old, moved := key("old", "default", 1), key("new", "default", 1)
	old.Models, moved.Models = []string{"m-old"}, []string{"m-new"}
	e := newEnv(t, old, moved)
	require.NoError(t, e.admin.SetAlias(t.Context(), provider, "m", "m-old"))
	b := broker.New(trusting(t, e), e.store, &broker.Options{Requests: e.requests, Logger: e.log})
	r := req("default")
	r.Model = "m"
	g := allocate(t, b, r)
	require.NoError(t, b.Release(t.Context(), g.LeaseRef))

	there := elsewhere(t, e, nil)
	require.NoError(t, broker.NewAdmin(there, e.store, nil).SetAlias(t.Context(), provider, "m", "m-new"))
	r.RequestID = "r1"
	first := allocate(t, broker.New(there, e.store, &broker.Options{Requests: e.requests, Logger: e.log}), r)
	require.Equal(t, "new", first.KeyID)
	again := allocate(t, b, r)
	require.Equal(t, first.LeaseID, again.LeaseID, "replayed")
}

// An answer of no grant the catalog cannot confirm, its database broken,
// is a catalog failure (503), never "full".
func TestNoGrantNeedsTheCatalog(t *testing.T) {
	e := newEnv(t, key("a", "default", 1))
	c := &flakyCatalog{Cache: trusting(t, e)}
	b := broker.New(c, e.store, &broker.Options{Logger: e.log})
	allocate(t, b, req("default"))
	c.currentErr = errInjected
	_, err := b.Allocate(t.Context(), req("default"))
	require.ErrorIs(t, err, broker.ErrCatalog)
	require.NotErrorIs(t, err, optimistic.ErrNoCapacity)
}
