package broker_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/sqlitestore"
	"github.com/credpool/credpool/optimistic"
)

// countingStore is the SQLite store, counting the syncs asked of it.
type countingStore struct {
	*sqlitestore.Store
	one, many atomic.Int32
}

func (s *countingStore) SyncKey(ctx context.Context, k optimistic.KeyState) error {
	s.one.Add(1)
	return s.Store.SyncKey(ctx, k)
}

func (s *countingStore) SyncKeys(ctx context.Context, keys ...optimistic.KeyState) error {
	s.many.Add(1)
	return s.Store.SyncKeys(ctx, keys...)
}

// oneByOne hides SyncKeys: a store that syncs key by key.
type oneByOne struct{ optimistic.LeaseStore }

// A bulk put syncs its keys in one write where the store can (SQLite:
// one transaction), and key by key where it cannot; either way every key
// reaches the store.
func TestPutManySyncsInOneWrite(t *testing.T) {
	var keys []catalog.Key
	for i := range 50 {
		keys = append(keys, key(fmt.Sprintf("k%d", i), "default", 2))
	}
	for _, tc := range []struct {
		name      string
		hide      bool
		one, many int32
	}{
		{"batching store", false, 0, 1},
		{"key by key", true, 50, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			cs := &countingStore{Store: e.store}
			var store optimistic.LeaseStore = cs
			if tc.hide {
				store = oneByOne{cs}
			}
			admin := broker.NewAdmin(e.cat, store, nil)
			stored, err := admin.PutMany(t.Context(), keys...)
			require.NoError(t, err)
			require.Len(t, stored, len(keys))
			require.Equal(t, tc.one, cs.one.Load(), "SyncKey calls")
			require.Equal(t, tc.many, cs.many.Load(), "SyncKeys calls")
			for _, k := range keys {
				in := e.info(t, k.ID)
				require.True(t, in.Exists, k.ID)
				require.Equal(t, 2, in.Limit, k.ID)
				require.False(t, e.get(t, k.ID).SyncedAt.IsZero(), "%s recorded as synced", k.ID)
			}
			// So a key the store loses afterwards is held back, not new.
			require.NoError(t, e.store.DeleteKey(t.Context(), "k3"))
			_, err = admin.Sync(t.Context())
			require.NoError(t, err)
			require.Equal(t, optimistic.StatusCooldown, e.info(t, "k3").Status, "lost: held back")
		})
	}
}
