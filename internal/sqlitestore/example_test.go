package sqlitestore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/credpool/credpool/internal/sqlitestore"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
)

func ExampleStore_Allocate() {
	dir, err := os.MkdirTemp("", "sqlitestore-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlitex.Open(filepath.Join(dir, "credpool.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	store, err := sqlitestore.New(context.Background(), db, nil)
	if err != nil {
		panic(err)
	}
	defer store.Close()
	ctx := context.Background()
	err = store.SyncKey(ctx, optimistic.KeyState{
		ID: "key-1", Provider: "openai", Pool: "default",
		Status: optimistic.StatusAvailable, MaxConcurrentUses: 1,
	})
	if err != nil {
		panic(err)
	}

	req := optimistic.AllocateRequest{
		Provider:   "openai",
		Pool:       "default",
		Candidates: []string{"key-1"}, // best first, ranked by the caller
		TTL:        35 * time.Second,
	}
	lease, _, err := store.Allocate(ctx, req)
	if err != nil {
		fmt.Println("allocate:", err)
		return
	}
	fmt.Println("granted", lease.KeyID, "fenced", lease.Fence > 0)

	// The key's one slot is taken: a normal "try later", not a failure.
	_, _, err = store.Allocate(ctx, req)
	var full *optimistic.CapacityError
	if errors.As(err, &full) {
		fmt.Println("full until the lease ends:", full.FreeAt.Equal(lease.Until))
	}

	fmt.Println("released:", store.Release(ctx, lease.LeaseRef) == nil)
	// Output:
	// granted key-1 fenced true
	// full until the lease ends: true
	// released: true
}
