package sqlitestore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/sqlitestore"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/internal/sqlitex/sqlitextest"
	"github.com/credpool/credpool/optimistic"
)

// newStore is a store on a fresh file, and the file's database.
func newStore(t *testing.T) (*sqlitestore.Store, *sqlitex.DB) {
	t.Helper()
	db := sqlitextest.Temp(t)
	s, err := sqlitestore.New(t.Context(), db, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s, db
}

func state(id string, limit int) optimistic.KeyState {
	return optimistic.KeyState{ID: id, Provider: "openai", Pool: "default", Status: optimistic.StatusAvailable, MaxConcurrentUses: limit}
}

// SyncKeys writes every key or, if one is invalid, none; an update keeps
// the key's leases.
func TestSyncKeysAllOrNothing(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	bad := state("k2", 1)
	bad.Status = "no such status"
	require.ErrorIs(t, s.SyncKeys(ctx, state("k0", 1), state("k1", 1), bad), optimistic.ErrInvalid)
	infos, err := s.Inspect(ctx, "k0", "k1")
	require.NoError(t, err)
	for _, in := range infos {
		require.False(t, in.Exists, "%s written although the batch failed", in.ID)
	}

	var keys []optimistic.KeyState
	for i := range 300 {
		keys = append(keys, state(fmt.Sprintf("k%d", i), 2))
	}
	require.NoError(t, s.SyncKeys(ctx, keys...))
	lease, _, err := s.Allocate(ctx, optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k7"}, TTL: time.Minute})
	require.NoError(t, err)
	keys[7].MaxConcurrentUses = 3
	require.NoError(t, s.SyncKeys(ctx, keys...))
	infos, err = s.Inspect(ctx, "k0", "k7", "k299")
	require.NoError(t, err)
	for _, in := range infos {
		require.True(t, in.Exists, in.ID)
	}
	require.Equal(t, 3, infos[1].Limit)
	require.Equal(t, 1, infos[1].Live, "%s keeps its lease", lease.LeaseID)
	require.NoError(t, s.SyncKeys(ctx), "no keys: nothing to do")
}

// A write that fails inside SyncKeys's transaction (the database refuses
// the second key) leaves none of the keys written.
func TestSyncKeysFailsWhole(t *testing.T) {
	s, db := newStore(t)
	_, err := db.ExecContext(t.Context(), `CREATE TRIGGER refuse_k1 BEFORE INSERT ON lease_keys WHEN NEW.id = 'k1'
BEGIN SELECT RAISE(ABORT, 'injected fault'); END`)
	require.NoError(t, err)

	ctx := context.Background()
	require.ErrorContains(t, s.SyncKeys(ctx, state("k0", 1), state("k1", 1), state("k2", 1)), "injected fault")
	infos, err := s.Inspect(ctx, "k0", "k2")
	require.NoError(t, err)
	for _, in := range infos {
		require.False(t, in.Exists, "%s written although the batch failed", in.ID)
	}
}

// A store closed is closed: every call fails with ErrStore (its statements
// are gone, and would otherwise be prepared again on every use).
func TestCallsAfterCloseFail(t *testing.T) {
	s, _ := newStore(t)
	ctx := t.Context()
	require.NoError(t, s.SyncKey(ctx, state("k", 1)))
	l, _, err := s.Allocate(ctx, optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	_, _, err = s.Allocate(ctx, optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute})
	require.ErrorIs(t, err, optimistic.ErrStore)
	require.ErrorIs(t, s.Release(ctx, l.LeaseRef), optimistic.ErrStore)
	_, err = s.Inspect(ctx, "k")
	require.ErrorIs(t, err, optimistic.ErrStore)
	require.ErrorIs(t, s.Ping(ctx), optimistic.ErrStore)
	_, err = s.Await(ctx, []string{"k"})
	require.ErrorIs(t, err, optimistic.ErrStore)
}

// Nodes shows the file takes writes by writing its probe row, unless a
// grant, release or renewal of the store committed lately: under load a
// probe would queue behind every grant for the write lock. A commit that
// changed nothing (a sync, an allocate that found no slot) shows nothing:
// it would hide a full disk.
func TestNodesWriteUnlessAWriteJustCommitted(t *testing.T) {
	s, db := newStore(t)
	ctx := t.Context()
	probes := func() int64 {
		var at int64
		err := db.QueryRowContext(ctx, `SELECT at FROM lease_probe`).Scan(&at)
		if errors.Is(err, sql.ErrNoRows) {
			return 0
		}
		require.NoError(t, err)
		return at
	}
	sqlitestore.SetProven(s, time.Hour)
	require.NoError(t, s.SyncKey(ctx, state("k", 1)))
	req := optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"k"}, TTL: time.Minute}
	_, _, err := s.Allocate(ctx, req)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `DELETE FROM lease_probe`)
	require.NoError(t, err)
	require.Equal(t, []optimistic.NodeHealth{{}}, s.Nodes(ctx))
	require.Zero(t, probes(), "the grant's commit showed it")

	fresh, db := newStore(t)
	sqlitestore.SetProven(fresh, time.Hour)
	require.NoError(t, fresh.SyncKey(ctx, state("k", 1)))
	other, err := sqlitestore.New(ctx, db, nil) // another process's
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	_, _, err = other.Allocate(ctx, req)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `DELETE FROM lease_probe`)
	require.NoError(t, err)
	_, _, err = fresh.Allocate(ctx, req)
	require.ErrorIs(t, err, optimistic.ErrNoCapacity)
	require.Equal(t, []optimistic.NodeHealth{{}}, fresh.Nodes(ctx))
	require.NotZero(t, probes(), "neither the sync nor the full allocate showed it: the probe wrote")
}
