package broker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/requestlog"
	"github.com/credpool/credpool/internal/sqlitestore"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
)

func TestAllocateGrants(t *testing.T) {
	e := newEnv(t, key("a", "default", 2))
	require.NoError(t, e.admin.SetAlias(t.Context(), provider, "latest", model))
	before := time.Now()

	r := req("default")
	r.Model = "latest"
	g := allocate(t, e.plain(), r)

	require.Equal(t, optimistic.LeaseRef{Provider: provider, Pool: "default", KeyID: "a", LeaseID: g.LeaseID}, g.LeaseRef)
	require.Equal(t, model, g.Model, "the alias resolves to the canonical model")
	require.Equal(t, "sk-a", g.Secret.Reveal())
	require.True(t, g.Until.After(before), "until %v", g.Until)
	require.Positive(t, g.Fence)
	require.Positive(t, g.Stats.Attempts)
	require.Equal(t, 1, e.live(t, "a"))
	require.False(t, e.get(t, "a").LastUsedAt.IsZero(), "the grant is recorded as a use in the catalog")
}

// Ranking knows a key's last grant from the store at once, although the
// catalog writes it behind: of two idle keys, the one another process just
// used ranks last. (By jitter alone this would pass 1 in 32 times.)
func TestRankUsesTheStoresLastGrant(t *testing.T) {
	for range 5 {
		e := newEnv(t, key("a", "default", 1), key("b", "default", 1))
		other := e.broker(cache(t, e.cat.SQL), e.store) // another process
		g := allocate(t, other, req("default"))
		require.NoError(t, other.Release(t.Context(), g.LeaseRef))
		require.NotEqual(t, g.KeyID, allocate(t, e.plain(), req("default")).KeyID)
	}
}

// An allocate reads the live state of the best Options.Inspect candidates
// only, whatever the pool's size; with every candidate read, the full ones
// go last. (Nothing read is kept here: see TestLiveStateKept.)
func TestRankReadsTheBestFew(t *testing.T) {
	var keys []catalog.Key
	for i := range 10 {
		keys = append(keys, key(fmt.Sprintf("k%d", i), "default", 1))
	}
	e := newEnv(t, keys...)
	s := &hookStore{Store: e.store}
	few := broker.New(e.cat, s, &broker.Options{Inspect: 3, LiveMaxAge: -1, Logger: e.log})
	held := map[string]bool{}
	for range 5 {
		held[allocate(t, few, req("default")).KeyID] = true
	}
	require.Len(t, s.inspected, 5)
	for _, ids := range s.inspected {
		require.Len(t, ids, 3)
	}

	all := broker.New(e.cat, s, &broker.Options{Inspect: -1, LiveMaxAge: -1, Logger: e.log})
	g := allocate(t, all, req("default"))
	require.False(t, held[g.KeyID])
	order := s.recorded()[len(s.recorded())-1].order
	require.Len(t, order, 10)
	for i, id := range order {
		require.Equal(t, i >= 5, held[id], "position %d: %s", i, id)
	}
}

func TestAllocateValidates(t *testing.T) {
	e := newEnv(t, key("a", "default", 1))
	for _, c := range []struct {
		name string
		edit func(r *broker.Request)
	}{
		{"no provider", func(r *broker.Request) { r.Provider = "" }},
		{"bad pool", func(r *broker.Request) { r.Pool = "no/slash" }},
		{"no ttl", func(r *broker.Request) { r.TTL = 0 }},
		{"no model", func(r *broker.Request) { r.Model = "" }},
		{"model with a space", func(r *broker.Request) { r.Model = "gpt 4o" }},
		{"model too long", func(r *broker.Request) { r.Model = strings.Repeat("m", 257) }},
		{"bad request id", func(r *broker.Request) { r.RequestID = "has space" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := req("default")
			c.edit(&r)
			_, err := e.plain().Allocate(t.Context(), r)
			require.ErrorIs(t, err, optimistic.ErrInvalid)
			require.Zero(t, e.live(t, "a"))
		})
	}

	t.Run("request id without a request log", func(t *testing.T) {
		r := req("default")
		r.RequestID = "r1"
		_, err := broker.New(e.cat, e.store, &broker.Options{Logger: e.log}).Allocate(t.Context(), r)
		require.ErrorIs(t, err, optimistic.ErrInvalid)
		require.Zero(t, e.live(t, "a"))
	})
}

func TestPoolFallback(t *testing.T) {
	t.Run("vip borrows default when full", func(t *testing.T) {
		e := newEnv(t, key("v", "vip", 1), key("d", "default", 1))
		b := e.plain()
		require.Equal(t, "v", allocate(t, b, req("vip")).KeyID, "vip's own key first")
		g := allocate(t, b, req("vip"))
		require.Equal(t, "d", g.KeyID)
		require.Equal(t, "default", g.Pool, "the lease names the pool it came from")
		_, err := b.Allocate(t.Context(), req("vip"))
		capacityError(t, err)
	})

	t.Run("default never borrows vip", func(t *testing.T) {
		e := newEnv(t, key("v", "vip", 1), key("d", "default", 1))
		b := e.plain()
		require.Equal(t, "d", allocate(t, b, req("default")).KeyID)
		_, err := b.Allocate(t.Context(), req("default"))
		capacityError(t, err)
		require.Zero(t, e.live(t, "v"))
	})

	t.Run("default with only vip keys has no candidates", func(t *testing.T) {
		e := newEnv(t, key("v", "vip", 1))
		_, err := e.plain().Allocate(t.Context(), req("default"))
		require.ErrorIs(t, err, broker.ErrNoCandidates)
	})

	t.Run("configured order replaces the default", func(t *testing.T) {
		e := newEnv(t, key("v", "vip", 1), key("d", "default", 1))
		b := broker.New(e.cat, e.store, &broker.Options{Pools: broker.PoolOrder{"default": {"vip"}}, Logger: e.log})
		require.Equal(t, "d", allocate(t, b, req("default")).KeyID)
		require.Equal(t, "v", allocate(t, b, req("default")).KeyID)
		_, err := b.Allocate(t.Context(), req("vip"))
		capacityError(t, err)
	})
}

func TestContendedPool(t *testing.T) {
	contended := func(pools ...string) func(optimistic.AllocateRequest) error {
		return func(r optimistic.AllocateRequest) error {
			for _, p := range pools {
				if r.Pool == p {
					return fmt.Errorf("%w: %w", optimistic.ErrContended, errInjected)
				}
			}
			return nil
		}
	}

	t.Run("vip contended falls through to default", func(t *testing.T) {
		e := newEnv(t, key("v", "vip", 1), key("d", "default", 1))
		s := &hookStore{Store: e.store, fault: contended("vip")}
		g := allocate(t, e.broker(e.cat, s), req("vip"))
		require.Equal(t, "d", g.KeyID)
		calls := s.recorded()
		require.Len(t, calls, 2)
		require.Equal(t, "vip", calls[0].pool)
		require.ErrorIs(t, calls[0].err, optimistic.ErrContended)
		require.Equal(t, allocCall{pool: "default", order: []string{"d"}, granted: "d"}, calls[1])
		require.Zero(t, e.live(t, "v"))
	})

	t.Run("every pool contended", func(t *testing.T) {
		e := newEnv(t, key("v", "vip", 1), key("d", "default", 1))
		s := &hookStore{Store: e.store, fault: contended("vip", "default")}
		_, err := e.broker(e.cat, s).Allocate(t.Context(), req("vip"))
		require.ErrorIs(t, err, optimistic.ErrContended)
		require.NotErrorIs(t, err, optimistic.ErrNoCapacity)
		require.Len(t, s.recorded(), 2, "a contended pool is tried once, not repaired")
		require.Zero(t, e.live(t, "v"))
		require.Zero(t, e.live(t, "d"))
	})
}

func TestAllocateNoCandidatesOrPolicy(t *testing.T) {
	// with returns key id in pool with an edit applied.
	with := func(id, pool string, edit func(k *catalog.Key)) catalog.Key {
		k := key(id, pool, 1)
		edit(&k)
		return k
	}
	otherModel := func(k *catalog.Key) { k.Models = []string{"gpt-3.5"} }
	statusOf := func(s optimistic.Status) func(k *catalog.Key) {
		return func(k *catalog.Key) { k.Status = s }
	}
	for _, c := range []struct {
		name string
		keys []catalog.Key
		pool string
		want error
	}{
		{"no keys at all", nil, "default", broker.ErrNoCandidates},
		{"keys of another provider only", []catalog.Key{
			with("x", "default", func(k *catalog.Key) { k.Provider = "anthropic" }),
		}, "vip", broker.ErrNoCandidates},
		{"no key serves the model", []catalog.Key{with("o", "default", otherModel)}, "default", broker.ErrPolicy},
		{"no key in vip or default serves the model", []catalog.Key{
			with("o", "default", otherModel), with("o2", "vip", otherModel),
		}, "vip", broker.ErrPolicy},
		{"every serving key disabled", []catalog.Key{
			with("o", "default", otherModel), with("a", "default", statusOf(optimistic.StatusDisabled)),
		}, "default", broker.ErrPolicy},
		{"serving keys disabled, pending, exhausted", []catalog.Key{
			with("a", "default", statusOf(optimistic.StatusDisabled)),
			with("b", "default", statusOf(optimistic.StatusPending)),
			with("c", "default", statusOf(optimistic.StatusExhausted)),
		}, "default", broker.ErrPolicy},
		{"rate limited without a cooldown end", []catalog.Key{
			with("a", "default", statusOf(optimistic.StatusRateLimited)),
		}, "default", broker.ErrPolicy},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, c.keys...)
			s := &hookStore{Store: e.store}
			_, err := e.broker(e.cat, s).Allocate(t.Context(), req(c.pool))
			require.ErrorIs(t, err, c.want)
			require.NotErrorIs(t, err, optimistic.ErrNoCapacity)
			require.Empty(t, s.recorded(), "no key is offered to the store, not even briefly")
		})
	}
}

func TestCapacityErrorFreeAt(t *testing.T) {
	// hold fills a pool's only key with a lease of ttl and returns its end.
	hold := func(t *testing.T, b *broker.Broker, pool string, ttl time.Duration) time.Time {
		t.Helper()
		r := req(pool)
		r.TTL = ttl
		g := allocate(t, b, r)
		require.Equal(t, pool, g.Pool)
		return g.Until
	}
	for _, c := range []struct {
		name               string
		vipTTL, defaultTTL time.Duration
		earliestIsVIP      bool
	}{
		{"default frees first", time.Hour, time.Minute, false},
		{"vip frees first", time.Minute, time.Hour, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, key("v", "vip", 1), key("d", "default", 1))
			b := e.plain()
			vip := hold(t, b, "vip", c.vipTTL)
			def := hold(t, b, "default", c.defaultTTL)
			want := def
			if c.earliestIsVIP {
				want = vip
			}
			_, err := b.Allocate(t.Context(), req("vip"))
			require.Equal(t, want.UnixMilli(), capacityError(t, err).FreeAt.UnixMilli())
			require.True(t, capacityError(t, err).Held, "a held lease may end sooner")
			require.Equal(t, 1, e.live(t, "v"))
			require.Equal(t, 1, e.live(t, "d"))
		})
	}

	t.Run("a cooling key's cooldown end counts", func(t *testing.T) {
		cooling := key("v", "vip", 1)
		cooling.Status, cooling.CooldownUntil = optimistic.StatusRateLimited, time.Now().Add(10*time.Minute)
		e := newEnv(t, cooling, key("d", "default", 1))
		b := e.plain()
		hold(t, b, "default", time.Hour)
		_, err := b.Allocate(t.Context(), req("vip"))
		require.Equal(t, cooling.CooldownUntil.UnixMilli(), capacityError(t, err).FreeAt.UnixMilli())
		require.False(t, capacityError(t, err).Held, "a cooldown's end is exact")
		require.Zero(t, e.live(t, "v"), "a cooling key is not offered to the store")
	})

	t.Run("the store's FreeAt passes through", func(t *testing.T) {
		e := newEnv(t, key("v", "vip", 1), key("d", "default", 1))
		hold(t, e.plain(), "default", time.Hour)
		soon := time.UnixMilli(time.Now().Add(time.Second).UnixMilli())
		s := &hookStore{Store: e.store, fault: func(r optimistic.AllocateRequest) error {
			if r.Pool == "vip" {
				return &optimistic.CapacityError{FreeAt: soon}
			}
			return nil
		}}
		_, err := e.broker(e.cat, s).Allocate(t.Context(), req("vip"))
		require.True(t, soon.Equal(capacityError(t, err).FreeAt), "free at %v, want %v", capacityError(t, err).FreeAt, soon)
	})
}

func TestCatalogFailures(t *testing.T) {
	t.Run("list", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 1))
		c := &flakyCatalog{Cache: e.cat, listErr: errInjected}
		_, err := e.broker(c, e.store).Allocate(t.Context(), req("default"))
		require.ErrorIs(t, err, broker.ErrCatalog)
		require.ErrorIs(t, err, errInjected, "the cause is kept")
		require.Zero(t, e.live(t, "a"))
	})

	t.Run("get during confirm gives the slot back", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 1), key("b", "default", 1))
		c := &flakyCatalog{Cache: e.cat, failRead: 1, readErr: errInjected}
		s := &hookStore{Store: e.store}
		_, err := e.broker(c, s).Allocate(t.Context(), req("default"))
		require.ErrorIs(t, err, broker.ErrCatalog)
		require.ErrorIs(t, err, errInjected)
		calls := s.recorded()
		require.Len(t, calls, 1, "a failing catalog stops the request, no other key is tried")
		require.NotEmpty(t, calls[0].granted)
		require.Zero(t, e.live(t, "a"))
		require.Zero(t, e.live(t, "b"))
	})

	t.Run("get during repair", func(t *testing.T) {
		e := newEnv(t)
		_, err := e.cat.Put(t.Context(), key("a", "default", 1)) // never synced
		require.NoError(t, err)
		c := &flakyCatalog{Cache: e.cat, failRead: 1, readErr: errInjected}
		_, err = e.broker(c, e.store).Allocate(t.Context(), req("default"))
		require.ErrorIs(t, err, broker.ErrCatalog)
		require.False(t, e.info(t, "a").Exists, "nothing synced")
	})

	t.Run("renew", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 1))
		g := allocate(t, e.plain(), req("default"))
		c := &flakyCatalog{Cache: e.cat, failRead: 1, readErr: errInjected}
		_, err := e.broker(c, e.store).Renew(t.Context(), g.LeaseRef, time.Minute)
		require.ErrorIs(t, err, broker.ErrCatalog)
		require.NotErrorIs(t, err, optimistic.ErrLeaseLost, "a catalog outage does not revoke the holder")
		require.Equal(t, 1, e.live(t, "a"))
	})
}

func TestCancellationIsNotCatalogFailure(t *testing.T) {
	t.Run("before the request", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 1))
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := e.plain().Allocate(ctx, req("default"))
		require.ErrorIs(t, err, context.Canceled)
		require.NotErrorIs(t, err, broker.ErrCatalog)
		require.Zero(t, e.live(t, "a"))
	})

	t.Run("between grant and confirm", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 1), key("b", "default", 1))
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		s := &hookStore{Store: e.store}
		_, err := e.broker(cancelingCatalog{Cache: e.cat, cancel: cancel}, s).Allocate(ctx, req("default"))
		require.ErrorIs(t, err, context.Canceled)
		require.NotErrorIs(t, err, broker.ErrCatalog)
		require.Len(t, s.recorded(), 1)
		require.Zero(t, e.live(t, "a"), "the slot is given back after the caller left")
		require.Zero(t, e.live(t, "b"))
	})

	t.Run("the store follows a key disabled meanwhile after the caller left", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 1))
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		s := &hookStore{Store: e.store, granted: func(l optimistic.Lease) {
			k := e.get(t, l.KeyID)
			k.Status = optimistic.StatusDisabled
			_, err := e.cat.Put(t.Context(), k) // the catalog only
			require.NoError(t, err)
		}}
		_, err := e.broker(cancelingCatalog{Cache: e.cat, cancel: cancel, afterRead: true}, s).Allocate(ctx, req("default"))
		require.ErrorIs(t, err, broker.ErrPolicy)
		require.Zero(t, e.live(t, "a"))
		require.Equal(t, optimistic.StatusDisabled, e.info(t, "a").Status, "no longer grantable in the store")
	})
}

func TestRepair(t *testing.T) {
	for _, c := range []struct {
		name string
		// stale makes the store's view of key a (limit 2) differ from the
		// catalog's, with held of its slots taken.
		stale func(t *testing.T, e *env)
		held  int
	}{
		{"never synced", func(t *testing.T, e *env) {
			_, err := e.cat.Put(t.Context(), key("a", "default", 2))
			require.NoError(t, err)
		}, 0},
		{"store says disabled", func(t *testing.T, e *env) {
			_, err := e.admin.Put(t.Context(), key("a", "default", 2))
			require.NoError(t, err)
			s := key("a", "default", 2).LeaseState()
			s.Status = optimistic.StatusDisabled
			require.NoError(t, e.store.SyncKey(t.Context(), s))
		}, 0},
		{"store has it in another pool", func(t *testing.T, e *env) {
			_, err := e.admin.Put(t.Context(), key("a", "default", 2))
			require.NoError(t, err)
			require.NoError(t, e.store.SyncKey(t.Context(), key("a", "vip", 2).LeaseState()))
		}, 0},
		{"store has a lower limit", func(t *testing.T, e *env) {
			_, err := e.admin.Put(t.Context(), key("a", "default", 2))
			require.NoError(t, err)
			allocate(t, e.plain(), req("default"))
			require.NoError(t, e.store.SyncKey(t.Context(), key("a", "default", 1).LeaseState()))
		}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			c.stale(t, e)
			s := &hookStore{Store: e.store}
			g := allocate(t, e.broker(e.cat, s), req("default"))
			require.Equal(t, "a", g.KeyID)

			calls := s.recorded()
			require.Len(t, calls, 2, "one store miss, one repair, one grant")
			require.ErrorIs(t, calls[0].err, optimistic.ErrNoCapacity)
			require.Equal(t, allocCall{pool: "default", order: []string{"a"}, granted: "a"}, calls[1])

			in := e.info(t, "a")
			require.True(t, in.Exists)
			require.Equal(t, "default", in.Pool)
			require.Equal(t, optimistic.StatusAvailable, in.Status)
			require.Equal(t, 2, in.Limit)
			require.Equal(t, c.held+1, in.Live)
		})
	}
}

// A stale key whose master takes no writes now is passed over; the
// repair goes on with the others. If the pool is still full, that is the
// store's failure (503), not a full pool (429): the key passed over may
// have room.
func TestRepairGoesOnPastAnUnreachableKey(t *testing.T) {
	setup := func(t *testing.T) (*env, *hookStore) {
		e := newEnv(t)
		for _, k := range []catalog.Key{key("down", "default", 5), key("up", "default", 1)} {
			_, err := e.cat.Put(t.Context(), k) // never synced
			require.NoError(t, err)
		}
		s := &hookStore{Store: e.store}
		down := "down"
		s.syncDown.Store(&down)
		return e, s
	}
	t.Run("the other grants", func(t *testing.T) {
		e, s := setup(t)
		g := allocate(t, e.broker(e.cat, s), req("default"))
		require.Equal(t, "up", g.KeyID)

		_, err := e.broker(e.cat, s).Allocate(t.Context(), req("default"))
		require.ErrorIs(t, err, optimistic.ErrUnreachable, "up is full, down could not be repaired")
		require.NotErrorIs(t, err, optimistic.ErrNoCapacity)
	})
	t.Run("the other is taken meanwhile", func(t *testing.T) {
		e, s := setup(t)
		s.fault = func(optimistic.AllocateRequest) error { return &optimistic.CapacityError{} }
		_, err := e.broker(e.cat, s).Allocate(t.Context(), req("default"))
		require.ErrorIs(t, err, optimistic.ErrUnreachable)
		require.NotErrorIs(t, err, optimistic.ErrNoCapacity)
		require.Len(t, s.recorded(), 2, "asked again after up's repair")
	})
}

func TestRepairDoesNotOversell(t *testing.T) {
	t.Run("full", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 1))
		held := allocate(t, e.plain(), req("default"))
		s := &hookStore{Store: e.store}
		_, err := e.broker(e.cat, s).Allocate(t.Context(), req("default"))
		require.Equal(t, held.Until.UnixMilli(), capacityError(t, err).FreeAt.UnixMilli())
		require.Len(t, s.recorded(), 1, "a store that agrees with the catalog is not asked again")
		require.Equal(t, int32(1), s.inspects.Load(), "nor read again: the ranking's read agrees with it")
		require.Equal(t, 1, e.live(t, "a"))
	})

	t.Run("full and stale", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 1))
		held := allocate(t, e.plain(), req("default"))
		s := key("a", "default", 1).LeaseState()
		s.Status = optimistic.StatusDisabled
		require.NoError(t, e.store.SyncKey(t.Context(), s)) // keeps the lease

		hs := &hookStore{Store: e.store}
		_, err := e.broker(e.cat, hs).Allocate(t.Context(), req("default"))
		require.Equal(t, held.Until.UnixMilli(), capacityError(t, err).FreeAt.UnixMilli())
		calls := hs.recorded()
		require.Len(t, calls, 2, "repaired, asked once more")
		require.ErrorIs(t, calls[1].err, optimistic.ErrNoCapacity, "still full after the repair")
		in := e.info(t, "a")
		require.Equal(t, optimistic.StatusAvailable, in.Status)
		require.Equal(t, 1, in.Live)
	})

	t.Run("key gone from the catalog is not written back", func(t *testing.T) {
		e := newEnv(t)
		_, err := e.cat.Put(t.Context(), key("a", "default", 1)) // never synced
		require.NoError(t, err)
		c := &flakyCatalog{Cache: e.cat, failRead: 1, readErr: fmt.Errorf("%w: %q", catalog.ErrNotFound, "a")}
		_, err = e.broker(c, e.store).Allocate(t.Context(), req("default"))
		require.ErrorIs(t, err, broker.ErrPolicy)
		require.False(t, e.info(t, "a").Exists)
	})
}

func TestConfirmGivesBack(t *testing.T) {
	for _, c := range []struct {
		name string
		// change edits the granted key in the catalog behind the store's
		// back; check looks at the store's view of it afterwards.
		change func(t *testing.T, e *env, id string)
		check  func(t *testing.T, in optimistic.KeyInfo)
	}{
		{"deleted", func(t *testing.T, e *env, id string) {
			require.NoError(t, e.cat.Delete(t.Context(), id))
		}, func(t *testing.T, in optimistic.KeyInfo) {
			require.False(t, in.Exists, "gone from the catalog, gone from the store")
		}},
		{"disabled", func(t *testing.T, e *env, id string) {
			k := e.get(t, id)
			k.Status = optimistic.StatusDisabled
			_, err := e.cat.Put(t.Context(), k)
			require.NoError(t, err)
		}, func(t *testing.T, in optimistic.KeyInfo) {
			require.Equal(t, optimistic.StatusDisabled, in.Status)
		}},
		{"rate limited", func(t *testing.T, e *env, id string) {
			_, err := e.cat.Report(t.Context(), id, uuid.NewString(), catalog.OutcomeRateLimited, time.Hour, time.Now())
			require.NoError(t, err)
		}, func(t *testing.T, in optimistic.KeyInfo) {
			require.Equal(t, optimistic.StatusRateLimited, in.Status)
		}},
		{"quarantined", func(t *testing.T, e *env, id string) {
			_, err := e.cat.Quarantine(t.Context(), id, time.Now().Add(time.Hour), time.Now())
			require.NoError(t, err)
		}, func(t *testing.T, in optimistic.KeyInfo) {
			require.Equal(t, optimistic.StatusCooldown, in.Status, "held back in the store too")
		}},
		{"moved to another pool", func(t *testing.T, e *env, id string) {
			k := e.get(t, id)
			k.Pool = "vip"
			_, err := e.cat.Put(t.Context(), k)
			require.NoError(t, err)
		}, func(t *testing.T, in optimistic.KeyInfo) {
			require.Equal(t, "vip", in.Pool)
		}},
		{"no longer serves the model", func(t *testing.T, e *env, id string) {
			k := e.get(t, id)
			k.Models = []string{"gpt-3.5"}
			_, err := e.cat.Put(t.Context(), k)
			require.NoError(t, err)
		}, func(t *testing.T, in optimistic.KeyInfo) {
			require.Equal(t, optimistic.StatusAvailable, in.Status)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, key("a", "default", 1), key("b", "default", 1))
			var first string
			s := &hookStore{Store: e.store, granted: func(l optimistic.Lease) {
				if first == "" { // runs on the test goroutine: the broker calls the store in line
					first = l.KeyID
					c.change(t, e, l.KeyID)
				}
			}}
			g := allocate(t, e.broker(e.cat, s), req("default"))

			require.NotEmpty(t, first)
			require.NotEqual(t, first, g.KeyID, "the next candidate is used")
			require.Equal(t, "sk-"+g.KeyID, g.Secret.Reveal())
			require.Len(t, s.recorded(), 2)
			require.Zero(t, e.live(t, first), "the first grant is given back")
			require.Equal(t, 1, e.live(t, g.KeyID))
			c.check(t, e.info(t, first))
		})
	}

	t.Run("the only key disabled", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 1))
		s := &hookStore{Store: e.store, granted: func(l optimistic.Lease) {
			k := e.get(t, l.KeyID)
			k.Status = optimistic.StatusDisabled
			_, err := e.cat.Put(t.Context(), k)
			require.NoError(t, err)
		}}
		_, err := e.broker(e.cat, s).Allocate(t.Context(), req("default"))
		require.ErrorIs(t, err, broker.ErrPolicy)
		require.Zero(t, e.live(t, "a"))
	})

	// The only key deleted between the grant and the re-check: the pool
	// has no candidates now (404), whichever way the request read the
	// catalog (a recent snapshot; the current catalog at the start, for a
	// request that waits or carries an id); not a policy conflict (409).
	for _, c := range []struct {
		name string
		req  func(r broker.Request) broker.Request
	}{
		{"plain", func(r broker.Request) broker.Request { return r }},
		{"with a request id", func(r broker.Request) broker.Request { r.RequestID = "req-1"; return r }},
		{"waiting", func(r broker.Request) broker.Request { r.Wait = time.Minute; return r }},
	} {
		t.Run("the only key deleted, "+c.name, func(t *testing.T) {
			e := newEnv(t, key("a", "default", 1))
			s := &hookStore{Store: e.store, granted: func(l optimistic.Lease) {
				require.NoError(t, e.cat.Delete(t.Context(), l.KeyID))
			}}
			_, err := e.broker(e.cat, s).Allocate(t.Context(), c.req(req("default")))
			require.ErrorIs(t, err, broker.ErrNoCandidates)
			require.NotErrorIs(t, err, broker.ErrPolicy)
			require.False(t, e.info(t, "a").Exists, "gone from the store too")
		})
	}

	// A key that starts cooling between the grant and the re-check frees
	// up by itself: "full until the cooldown ends" (429), not a policy
	// conflict (409).
	t.Run("the only key rate limited", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 1))
		var until time.Time
		s := &hookStore{Store: e.store, granted: func(l optimistic.Lease) {
			k, err := e.cat.Report(t.Context(), l.KeyID, uuid.NewString(), catalog.OutcomeRateLimited, time.Hour, time.Now())
			require.NoError(t, err)
			until = k.CooldownUntil
		}}
		_, err := e.broker(e.cat, s).Allocate(t.Context(), req("default"))
		var full *optimistic.CapacityError
		require.ErrorAs(t, err, &full)
		require.NotErrorIs(t, err, broker.ErrPolicy)
		require.True(t, full.FreeAt.Equal(until), "FreeAt %v, cooldown ends %v", full.FreeAt, until)
		require.Zero(t, e.live(t, "a"))
	})

	// So does a key quarantined meanwhile (another instance found the
	// store lost it): full until the quarantine ends.
	t.Run("the only key quarantined", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 1))
		var until time.Time
		s := &hookStore{Store: e.store, granted: func(l optimistic.Lease) {
			k, err := e.cat.Quarantine(t.Context(), l.KeyID, time.Now().Add(time.Hour), time.Now())
			require.NoError(t, err)
			until = k.QuarantineUntil
		}}
		_, err := e.broker(e.cat, s).Allocate(t.Context(), req("default"))
		require.NotErrorIs(t, err, broker.ErrPolicy)
		full := capacityError(t, err)
		require.True(t, full.FreeAt.Equal(until), "FreeAt %v, quarantine ends %v", full.FreeAt, until)
		require.False(t, full.Held, "a quarantine's end is exact")
		require.Zero(t, e.live(t, "a"))
	})
}

// allocResult is what one Allocate answered.
type allocResult struct {
	g   broker.Grant
	err error
}

// raceAllocate runs n Allocates of r on b at once and returns what each
// answered, once all have.
func raceAllocate(t *testing.T, b *broker.Broker, r broker.Request, n int) []allocResult {
	t.Helper()
	out := make([]allocResult, n)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() {
			out[i].g, out[i].err = b.Allocate(t.Context(), r)
		})
	}
	wg.Wait()
	return out
}

// TestConcurrentAllocate races callers on keys the store has never seen:
// each may repair the store, and still no key holds more leases than its
// limit.
func TestConcurrentAllocate(t *testing.T) {
	e := newEnv(t)
	limits := map[string]int{"a": 1, "b": 2, "c": 1}
	capacity := 0
	for id, n := range limits {
		_, err := e.cat.Put(t.Context(), key(id, "default", n)) // never synced
		require.NoError(t, err)
		capacity += n
	}
	b := e.plain()

	leases := map[string]bool{}
	full := 0
	for _, r := range raceAllocate(t, b, req("default"), 12) {
		var ce *optimistic.CapacityError
		switch {
		case r.err == nil:
			leases[r.g.LeaseID] = true
		case errors.As(r.err, &ce):
			require.False(t, ce.FreeAt.IsZero(), "full means some lease ends")
			full++
		default:
			require.ErrorIs(t, r.err, optimistic.ErrContended)
		}
	}
	require.LessOrEqual(t, len(leases), capacity)
	if full > 0 {
		require.Len(t, leases, capacity, "full was answered, so every slot is taken")
	}
	total := 0
	for id, n := range limits {
		in := e.info(t, id)
		require.LessOrEqual(t, in.Live, n, "key %s", id)
		total += in.Live
	}
	require.Equal(t, len(leases), total)
}

func TestReplay(t *testing.T) {
	e := newEnv(t, key("a", "default", 2))
	b := e.plain()
	withID := func(id string, ttl time.Duration) broker.Request {
		r := req("default")
		r.RequestID, r.TTL = id, ttl
		return r
	}

	first := allocate(t, b, withID("r1", time.Minute))
	again := allocate(t, b, withID("r1", time.Hour))
	require.Equal(t, first.LeaseRef, again.LeaseRef, "the same id gets the same lease")
	require.Equal(t, first.Fence, again.Fence)
	require.Equal(t, first.Secret, again.Secret)
	require.True(t, again.Until.After(first.Until), "renewed: %v, was %v", again.Until, first.Until)
	require.Equal(t, 1, e.live(t, "a"), "no second slot")

	other := allocate(t, b, withID("r2", time.Minute))
	require.NotEqual(t, first.LeaseID, other.LeaseID)
	require.Equal(t, 2, e.live(t, "a"))

	require.NoError(t, b.Release(t.Context(), first.LeaseRef))
	fresh := allocate(t, b, withID("r1", time.Minute))
	require.NotEqual(t, first.LeaseID, fresh.LeaseID, "a released lease is not handed out again")
	require.Equal(t, 2, e.live(t, "a"))

	// A request that failed leaves its id free for the retry.
	_, err := b.Allocate(t.Context(), withID("r3", time.Minute))
	capacityError(t, err)
	require.NoError(t, b.Release(t.Context(), other.LeaseRef))
	retried := allocate(t, b, withID("r3", time.Minute))
	require.Equal(t, 2, e.live(t, "a"))
	require.Equal(t, retried.LeaseRef, allocate(t, b, withID("r3", time.Minute)).LeaseRef)
}

// A replay whose key the catalog no longer backs for the request (the
// key disabled; or no longer serving the model the id was served on, which
// a fresh grant's re-check would refuse too) is given back, and the
// request allocated afresh.
func TestReplayRevokedKey(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(k *catalog.Key)
	}{
		{"disabled", func(k *catalog.Key) { k.Status = optimistic.StatusDisabled }},
		{"no longer serves the model", func(k *catalog.Key) { k.Models = []string{"gpt-3.5"} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, key("a", "default", 1), key("b", "default", 1))
			b := e.plain()
			r := req("default")
			r.RequestID = "r1"
			first := allocate(t, b, r)

			k := e.get(t, first.KeyID)
			c.change(&k)
			_, err := e.cat.Put(t.Context(), k) // the catalog only: Renew must see it there
			require.NoError(t, err)

			g := allocate(t, b, r)
			require.NotEqual(t, first.KeyID, g.KeyID, "the replay finds its lease revoked and allocates afresh")
			require.Equal(t, "sk-"+g.KeyID, g.Secret.Reveal())
			require.Zero(t, e.live(t, first.KeyID))
			require.Equal(t, 1, e.live(t, g.KeyID))
		})
	}
}

func TestRequestInFlight(t *testing.T) {
	e := newEnv(t, key("a", "default", 2))
	b := broker.New(e.cat, e.store, &broker.Options{Requests: lostRecord{e.requests}, Logger: e.log})
	r := req("default")
	r.RequestID = "r1"

	allocate(t, b, r) // granted; the record is lost, so r1 stays claimed
	_, err := b.Allocate(t.Context(), r)
	require.ErrorIs(t, err, requestlog.ErrInFlight)
	require.Equal(t, 1, e.live(t, "a"), "an in-flight id takes no slot")

	r.RequestID = "r2"
	allocate(t, b, r)
	require.Equal(t, 2, e.live(t, "a"))
}

func TestReplayConcurrent(t *testing.T) {
	e := newEnv(t, key("a", "default", 4))
	b := e.plain()
	r := req("default")
	r.RequestID = "r1"

	leases := map[string]bool{}
	for _, res := range raceAllocate(t, b, r, 8) {
		if res.err != nil {
			if !errors.Is(res.err, optimistic.ErrContended) {
				require.ErrorIs(t, res.err, requestlog.ErrInFlight)
			}
			continue
		}
		leases[res.g.LeaseID] = true
	}
	require.Len(t, leases, 1, "one id, one lease, the first claimer's: %v", leases)
	require.Equal(t, len(leases), e.live(t, "a"))
}

func TestRenew(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(t *testing.T, e *env)
		lost   bool
	}{
		{"unchanged", func(*testing.T, *env) {}, false},
		{"disabled", status(optimistic.StatusDisabled, time.Time{}), true},
		{"pending", status(optimistic.StatusPending, time.Time{}), true},
		{"exhausted", status(optimistic.StatusExhausted, time.Time{}), true},
		{"rate limited keeps its holder", status(optimistic.StatusRateLimited, time.Now().Add(time.Hour)), false},
		{"cooldown keeps its holder", status(optimistic.StatusCooldown, time.Now().Add(time.Hour)), false},
		{"deleted", func(t *testing.T, e *env) {
			require.NoError(t, e.cat.Delete(t.Context(), "a"))
		}, true},
		{"moved to another pool", func(t *testing.T, e *env) {
			k := e.get(t, "a")
			k.Pool = "vip"
			_, err := e.cat.Put(t.Context(), k)
			require.NoError(t, err)
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, key("a", "default", 1))
			b := e.plain()
			g := allocate(t, b, req("default"))
			c.change(t, e) // in the catalog only, the store is not told

			until, err := b.Renew(t.Context(), g.LeaseRef, time.Hour)
			if c.lost {
				require.ErrorIs(t, err, optimistic.ErrLeaseLost)
				require.Zero(t, e.live(t, "a"), "a revoked lease is released")
				return
			}
			require.NoError(t, err)
			require.True(t, until.After(g.Until), "until %v, was %v", until, g.Until)
			require.Equal(t, 1, e.live(t, "a"))
		})
	}

	// A vip request served by default, renewed as vip: the caller names
	// the wrong owner; the key did not move, and the lease stays its.
	t.Run("renewed under another pool than granted", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 1))
		b := e.plain()
		g := allocate(t, b, req("vip"))
		require.Equal(t, "default", g.Pool)
		wrong := g.LeaseRef
		wrong.Pool = "vip"
		_, err := b.Renew(t.Context(), wrong, time.Hour)
		require.ErrorIs(t, err, optimistic.ErrLeaseMismatch)
		require.Equal(t, 1, e.live(t, "a"), "left alone")
		until, err := b.Renew(t.Context(), g.LeaseRef, time.Hour)
		require.NoError(t, err)
		require.True(t, until.After(g.Until))
	})

	t.Run("released lease", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 1))
		b := e.plain()
		g := allocate(t, b, req("default"))
		require.NoError(t, b.Release(t.Context(), g.LeaseRef))
		_, err := b.Renew(t.Context(), g.LeaseRef, time.Minute)
		require.ErrorIs(t, err, optimistic.ErrLeaseLost)
		require.ErrorIs(t, b.Release(t.Context(), g.LeaseRef), optimistic.ErrLeaseLost, "releasing twice")
	})

	t.Run("malformed ref", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 1))
		_, err := e.plain().Renew(t.Context(), optimistic.LeaseRef{Provider: provider, Pool: "default", KeyID: "a"}, time.Minute)
		require.ErrorIs(t, err, optimistic.ErrInvalid)
	})
}

// A heartbeat reads no secret: a key whose secret this process cannot
// open (its sealing key rotated out too early, say) still renews. Only
// handing the secret out needs it.
func TestRenewReadsNoSecret(t *testing.T) {
	e := newEnv(t, key("a", "default", 1))
	sealed, err := catalog.New(t.Context(), e.db, &catalog.Options{Sealer: testSealer(t, 1)})
	require.NoError(t, err)
	_, err = sealed.Put(t.Context(), key("a", "default", 1))
	require.NoError(t, err)
	g := allocate(t, e.broker(cache(t, sealed), e.store), req("default"))

	other, err := catalog.New(t.Context(), e.db, &catalog.Options{Sealer: testSealer(t, 2)})
	require.NoError(t, err)
	_, err = other.Get(t.Context(), "a")
	require.Error(t, err, "the secret does not open here")
	_, err = e.broker(cache(t, other), e.store).Renew(t.Context(), g.LeaseRef, time.Minute)
	require.NoError(t, err)
}

// A key whose secret does not open here (sealed with a sealing key this
// instance lacks) is passed over: its grant is given back and the other
// keys serve, instead of the pool answering 503 while they sit free. Once
// only that key could have room, the answer is that failure, never 429.
func TestUnopenedSecretPassesTheKeyOver(t *testing.T) {
	e := newEnv(t, key("bad", "default", 50), key("good", "default", 5))
	var logs bytes.Buffer
	b := broker.New(unopenedHere(t, e, key("bad", "default", 50)), e.store,
		&broker.Options{Requests: e.requests, Logger: slog.New(slog.NewTextHandler(&logs, nil))})

	for range 5 {
		g := allocate(t, b, req("default"))
		require.Equal(t, "good", g.KeyID)
		require.Equal(t, "sk-good", g.Secret.Reveal())
	}
	require.Contains(t, logs.String(), "key passed over", "the bad key, ranked first by its free slots, was granted and given back")
	require.Contains(t, logs.String(), "key_id=bad")
	require.Equal(t, 1, strings.Count(logs.String(), "grant given back"), "then ranked last, behind the key with room")
	_, err := b.Allocate(t.Context(), req("default"))
	require.ErrorIs(t, err, catalog.ErrSecret)
	require.ErrorIs(t, err, optimistic.ErrStore)
	require.NotErrorIs(t, err, optimistic.ErrNoCapacity)
	require.Zero(t, e.live(t, "bad"), "every grant of it given back")
	require.Equal(t, 1, strings.Count(logs.String(), "key passed over"), "warned of once")
}

// A pool whose only key's secret does not open here falls back as a full
// one does: vip borrows default.
func TestUnopenedSecretFallsBack(t *testing.T) {
	e := newEnv(t, key("bad", "vip", 1), key("good", "default", 1))
	b := e.broker(unopenedHere(t, e, key("bad", "vip", 1)), e.store)
	g := allocate(t, b, req("vip"))
	require.Equal(t, "good", g.KeyID)
	_, err := b.Allocate(t.Context(), req("vip"))
	require.ErrorIs(t, err, catalog.ErrSecret, "default full, vip's key passed over: not 429")
	require.NotErrorIs(t, err, optimistic.ErrNoCapacity)
}

// unopenedHere puts bad again, its secret sealed with a sealing key, and
// returns a catalog cache over e's file that has another: bad's secret
// does not open through it.
func unopenedHere(t *testing.T, e *env, bad catalog.Key) *catalog.Cache {
	t.Helper()
	sealed, err := catalog.New(t.Context(), e.db, &catalog.Options{Sealer: testSealer(t, 1)})
	require.NoError(t, err)
	_, err = sealed.Put(t.Context(), bad)
	require.NoError(t, err)
	here, err := catalog.New(t.Context(), e.db, &catalog.Options{Sealer: testSealer(t, 2)})
	require.NoError(t, err)
	return cache(t, here)
}

func testSealer(t *testing.T, b byte) *catalog.Sealer {
	t.Helper()
	s, err := catalog.NewSealer(bytes.Repeat([]byte{b}, 32))
	require.NoError(t, err)
	return s
}

// status returns a change that sets key a's status and cooldown end in the
// catalog.
func status(s optimistic.Status, cooldownUntil time.Time) func(t *testing.T, e *env) {
	return func(t *testing.T, e *env) {
		t.Helper()
		k := e.get(t, "a")
		k.Status, k.CooldownUntil = s, cooldownUntil
		_, err := e.cat.Put(t.Context(), k)
		require.NoError(t, err)
	}
}

func TestReport(t *testing.T) {
	for _, c := range []struct {
		name       string
		outcome    catalog.Outcome
		retryAfter time.Duration
		// check sees the key in the catalog and the store after the report,
		// and what the next allocate answered.
		check func(t *testing.T, k catalog.Key, in optimistic.KeyInfo, next error)
	}{
		{"success", catalog.OutcomeSuccess, 0, func(t *testing.T, k catalog.Key, in optimistic.KeyInfo, next error) {
			require.Equal(t, int64(1), k.Successes)
			require.NoError(t, next)
		}},
		{"error", catalog.OutcomeError, 0, func(t *testing.T, k catalog.Key, in optimistic.KeyInfo, next error) {
			require.Equal(t, int64(1), k.Errors)
			require.Equal(t, optimistic.StatusAvailable, k.Status)
			require.NoError(t, next)
		}},
		{"rate limited", catalog.OutcomeRateLimited, time.Hour, func(t *testing.T, k catalog.Key, in optimistic.KeyInfo, next error) {
			require.Equal(t, int64(1), k.RateLimitHits)
			require.Equal(t, optimistic.StatusRateLimited, k.Status)
			require.Equal(t, optimistic.StatusRateLimited, in.Status, "the store is told")
			require.Equal(t, k.CooldownUntil.UnixMilli(), in.CooldownUntil.UnixMilli())
			require.Equal(t, k.CooldownUntil.UnixMilli(), capacityError(t, next).FreeAt.UnixMilli())
		}},
		{"auth error", catalog.OutcomeAuthError, 0, func(t *testing.T, k catalog.Key, in optimistic.KeyInfo, next error) {
			require.Equal(t, int64(1), k.Errors)
			require.Equal(t, optimistic.StatusDisabled, k.Status)
			require.Equal(t, optimistic.StatusDisabled, in.Status, "the store is told")
			require.ErrorIs(t, next, broker.ErrPolicy)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, key("a", "default", 1))
			b := e.plain()
			g := allocate(t, b, req("default"))

			require.NoError(t, b.Report(t.Context(), g.LeaseRef, c.outcome, c.retryAfter))
			require.Zero(t, e.live(t, "a"), "a report releases the lease")
			after := e.get(t, "a")

			err := b.Report(t.Context(), g.LeaseRef, c.outcome, c.retryAfter)
			require.ErrorIs(t, err, optimistic.ErrLeaseLost, "a second report of the same lease")
			again := e.get(t, "a")
			require.Equal(t, []int64{after.Successes, after.Errors, after.RateLimitHits},
				[]int64{again.Successes, again.Errors, again.RateLimitHits}, "counted once")

			_, next := b.Allocate(t.Context(), req("default"))
			c.check(t, again, e.info(t, "a"), next)
		})
	}

	t.Run("unknown outcome", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 1))
		b := e.plain()
		g := allocate(t, b, req("default"))
		require.ErrorIs(t, b.Report(t.Context(), g.LeaseRef, "fine", 0), optimistic.ErrInvalid)
		require.Equal(t, 1, e.live(t, "a"), "an invalid report leaves the lease held")
	})

	t.Run("key gone from the catalog", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 1))
		b := e.plain()
		g := allocate(t, b, req("default"))
		require.NoError(t, e.cat.Delete(t.Context(), "a"))
		require.NoError(t, b.Report(t.Context(), g.LeaseRef, catalog.OutcomeSuccess, 0))
		require.Zero(t, e.live(t, "a"))
	})
}

func TestRecoverCooldown(t *testing.T) {
	k := key("a", "default", 1)
	k.Status, k.CooldownUntil = optimistic.StatusRateLimited, time.Now().Add(-time.Minute)
	e := newEnv(t, k)
	g := allocate(t, e.plain(), req("default"))
	require.Equal(t, "a", g.KeyID, "a passed cooldown does not keep the key out")
	got := e.get(t, "a")
	require.Equal(t, optimistic.StatusAvailable, got.Status, "recovered in the catalog")
	require.True(t, got.CooldownUntil.IsZero())
}

func TestAdmin(t *testing.T) {
	t.Run("put syncs the store", func(t *testing.T) {
		e := newEnv(t)
		_, err := e.admin.Put(t.Context(), key("a", "default", 3))
		require.NoError(t, err)
		in := e.info(t, "a")
		require.True(t, in.Exists)
		require.Equal(t, provider, in.Provider)
		require.Equal(t, "default", in.Pool)
		require.Equal(t, optimistic.StatusAvailable, in.Status)
		require.Equal(t, 3, in.Limit)

		k := key("a", "vip", 1)
		k.Status = optimistic.StatusDisabled
		_, err = e.admin.Put(t.Context(), k)
		require.NoError(t, err)
		in = e.info(t, "a")
		require.Equal(t, "vip", in.Pool)
		require.Equal(t, optimistic.StatusDisabled, in.Status)
		require.Equal(t, 1, in.Limit)
	})

	t.Run("put rejects a bad key", func(t *testing.T) {
		e := newEnv(t)
		_, err := e.admin.Put(t.Context(), key("a", "default", 0))
		require.ErrorIs(t, err, optimistic.ErrInvalid)
		require.False(t, e.info(t, "a").Exists)
	})

	t.Run("delete removes from both", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 1), key("b", "default", 1))
		b := e.plain()
		g := allocate(t, b, req("default"))

		require.NoError(t, e.admin.Delete(t.Context(), g.KeyID))
		_, err := e.cat.Get(t.Context(), g.KeyID)
		require.ErrorIs(t, err, catalog.ErrNotFound)
		require.False(t, e.info(t, g.KeyID).Exists)
		_, err = b.Renew(t.Context(), g.LeaseRef, time.Minute)
		require.ErrorIs(t, err, optimistic.ErrLeaseLost, "its leases are lost")

		require.ErrorIs(t, e.admin.Delete(t.Context(), g.KeyID), catalog.ErrNotFound)
		require.ErrorIs(t, e.admin.Delete(t.Context(), "bad id"), optimistic.ErrInvalid)
	})

	t.Run("delete cleans the store of a key the catalog lost", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 1))
		require.NoError(t, e.cat.Delete(t.Context(), "a"))
		require.NoError(t, e.admin.Delete(t.Context(), "a"), "what the store had of it was deleted")
		require.False(t, e.info(t, "a").Exists)
		require.ErrorIs(t, e.admin.Delete(t.Context(), "a"), catalog.ErrNotFound, "then neither has it")
	})

	t.Run("keys show live state, never secrets", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 2))
		_, err := e.cat.Put(t.Context(), key("b", "default", 1)) // never synced
		require.NoError(t, err)
		allocate(t, e.plain(), req("default"))
		allocate(t, e.plain(), req("default"))

		views, err := e.admin.Keys(t.Context())
		require.NoError(t, err)
		require.Len(t, views, 2)
		for _, v := range views {
			require.Empty(t, v.Secret.Reveal(), "key %s", v.ID)
		}
		require.Equal(t, "a", views[0].ID)
		require.True(t, views[0].InStore)
		require.Equal(t, "b", views[1].ID)

		v, err := e.admin.Key(t.Context(), "a")
		require.NoError(t, err)
		require.Empty(t, v.Secret.Reveal())
		require.Equal(t, e.live(t, "a"), v.Live)
		_, err = e.admin.Key(t.Context(), "missing")
		require.ErrorIs(t, err, catalog.ErrNotFound)
	})

	t.Run("sync writes every catalog key", func(t *testing.T) {
		e := newEnv(t)
		for _, id := range []string{"a", "b"} {
			_, err := e.cat.Put(t.Context(), key(id, "default", 1)) // never synced
			require.NoError(t, err)
		}
		n, err := e.admin.Sync(t.Context())
		require.NoError(t, err)
		require.Equal(t, 2, n)
		require.True(t, e.info(t, "a").Exists)
		require.True(t, e.info(t, "b").Exists)
	})

	t.Run("clear leases", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 2))
		b := e.plain()
		g := allocate(t, b, req("default"))
		allocate(t, b, req("default"))
		n, err := e.admin.ClearLeases(t.Context(), "a")
		require.NoError(t, err)
		require.Equal(t, 2, n)
		require.Zero(t, e.live(t, "a"))
		_, err = b.Renew(t.Context(), g.LeaseRef, time.Minute)
		require.ErrorIs(t, err, optimistic.ErrLeaseLost)

		n, err = e.admin.ClearLeases(t.Context(), "a")
		require.NoError(t, err, "a key with no leases")
		require.Zero(t, n)
		_, err = e.admin.ClearLeases(t.Context(), "typo")
		require.ErrorIs(t, err, catalog.ErrNotFound, "no such key: not 'cleared 0'")
	})

	t.Run("clear leases of a key deleted behind the store's back", func(t *testing.T) {
		e := newEnv(t, key("a", "default", 1))
		allocate(t, e.plain(), req("default"))
		require.NoError(t, e.cat.Delete(t.Context(), "a"))
		n, err := e.admin.ClearLeases(t.Context(), "a")
		require.NoError(t, err)
		require.Equal(t, 1, n, "its leases are cleared all the same")
	})

	t.Run("ready", func(t *testing.T) {
		e := newEnv(t)
		require.NoError(t, e.admin.Ready(t.Context()))
	})

	t.Run("ready with the store's db closed", func(t *testing.T) {
		e := newEnv(t)
		db, err := sqlitex.Open(filepath.Join(t.TempDir(), "store.db"))
		require.NoError(t, err)
		store, err := sqlitestore.New(t.Context(), db, nil)
		require.NoError(t, err)
		require.NoError(t, db.Close())

		err = broker.NewAdmin(e.cat, store, nil).Ready(t.Context())
		require.ErrorIs(t, err, optimistic.ErrStore)
		require.NotErrorIs(t, err, broker.ErrCatalog)
	})

	t.Run("ready with the catalog's db closed", func(t *testing.T) {
		e := newEnv(t)
		db, err := sqlitex.Open(filepath.Join(t.TempDir(), "catalog.db"))
		require.NoError(t, err)
		cat, err := catalog.New(t.Context(), db, nil)
		require.NoError(t, err)
		require.NoError(t, db.Close())

		err = broker.NewAdmin(cat, e.store, nil).Ready(t.Context())
		require.ErrorIs(t, err, broker.ErrCatalog)

		// Clearing leases also lifts a hold the catalog keeps: with the
		// catalog down that part fails, and says so.
		n, err := broker.NewAdmin(cat, e.store, nil).ClearLeases(t.Context(), "a")
		require.ErrorIs(t, err, broker.ErrCatalog)
		require.Zero(t, n)
	})
}

// racingStore lets another writer change a key, in the catalog and then
// in the store, between a sync's catalog read and its store write.
type racingStore struct {
	*sqlitestore.Store
	once   sync.Once
	racer  func()
	synced []optimistic.KeyState
}

func (s *racingStore) SyncKey(ctx context.Context, k optimistic.KeyState) error {
	s.once.Do(s.racer)
	s.synced = append(s.synced, k)
	return s.Store.SyncKey(ctx, k)
}

// A sync whose store write lands after another instance's newer write
// (catalog, then store) does not leave the store with its older view: it
// reads the catalog again after writing, and writes the newer state, or
// deletes a key deleted meanwhile.
func TestSyncNeverUndoesANewerWrite(t *testing.T) {
	disabled := key("a", "default", 2)
	disabled.Status = optimistic.StatusDisabled
	for _, c := range []struct {
		name  string
		other func(t *testing.T, e *env)
		check func(t *testing.T, in optimistic.KeyInfo)
	}{
		{"disabled meanwhile", func(t *testing.T, e *env) {
			_, err := e.admin.Put(t.Context(), disabled)
			require.NoError(t, err)
		}, func(t *testing.T, in optimistic.KeyInfo) {
			require.Equal(t, optimistic.StatusDisabled, in.Status)
			require.Equal(t, 2, in.Limit)
		}},
		{"deleted meanwhile", func(t *testing.T, e *env) {
			require.NoError(t, e.admin.Delete(t.Context(), "a"))
		}, func(t *testing.T, in optimistic.KeyInfo) {
			require.False(t, in.Exists)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, key("a", "default", 1))
			s := &racingStore{Store: e.store}
			s.racer = func() { c.other(t, e) }
			_, err := broker.NewAdmin(e.cat, s, nil).Put(t.Context(), key("a", "default", 3))
			if err != nil {
				require.ErrorIs(t, err, catalog.ErrNotFound)
			}
			require.Equal(t, 3, s.synced[0].MaxConcurrentUses, "the older view was written first")
			c.check(t, e.info(t, "a"))
		})
	}
}
