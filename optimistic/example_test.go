package optimistic_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/credpool/credpool/internal/redisproc"
	"github.com/credpool/credpool/optimistic"
)

// redisAddr is a throwaway redis-server for the examples.
var redisAddr string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "credpool-example-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	srv, err := redisproc.Run(dir, false)
	if err != nil {
		fmt.Fprintln(os.Stderr, "examples need a real redis-server:", err)
		os.Exit(1)
	}
	redisAddr = srv.Addr
	code := m.Run()
	srv.Stop()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// newExampleStore returns a store whose keys start with prefix, holding one
// available key with the given limit.
func newExampleStore(prefix string, limit int) (*optimistic.Store, func()) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	store, err := optimistic.New(rdb, &optimistic.Options{Prefix: prefix})
	if err != nil {
		panic(err)
	}
	err = store.SyncKey(context.Background(), optimistic.KeyState{
		ID: "key-1", Provider: "openai", Pool: "default",
		Status: optimistic.StatusAvailable, MaxConcurrentUses: limit,
	})
	if err != nil {
		panic(err)
	}
	return store, func() { _ = rdb.Close() }
}

func ExampleStore_Allocate() {
	store, done := newExampleStore("example-allocate", 1)
	defer done()
	ctx := context.Background()

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
	// Output:
	// granted key-1 fenced true
	// full until the lease ends: true
}

func ExampleStore_Release() {
	store, done := newExampleStore("example-release", 1)
	defer done()
	ctx := context.Background()

	req := optimistic.AllocateRequest{Provider: "openai", Pool: "default", Candidates: []string{"key-1"}, TTL: time.Minute}
	lease, _, err := store.Allocate(ctx, req)
	if err != nil {
		fmt.Println("allocate:", err)
		return
	}
	// ... call the upstream API with the credential ...
	fmt.Println("released:", store.Release(ctx, lease.LeaseRef) == nil)
	// Releasing again is harmless and says the lease is gone.
	fmt.Println("again:", errors.Is(store.Release(ctx, lease.LeaseRef), optimistic.ErrLeaseLost))
	// The slot is free at once.
	_, _, err = store.Allocate(ctx, req)
	fmt.Println("allocate after release:", err)
	// Output:
	// released: true
	// again: true
	// allocate after release: <nil>
}

func ExampleStore_Renew() {
	store, done := newExampleStore("example-renew", 1)
	defer done()
	ctx := context.Background()

	lease, _, err := store.Allocate(ctx, optimistic.AllocateRequest{
		Provider: "openai", Pool: "default", Candidates: []string{"key-1"}, TTL: 2 * time.Second,
	})
	if err != nil {
		fmt.Println("allocate:", err)
		return
	}
	// A heartbeat for long work: renew well before the lease ends. If it
	// fails with ErrLeaseLost, stop using the credential.
	until, err := store.Renew(ctx, lease.LeaseRef, time.Minute)
	fmt.Println("extended:", err == nil && until.After(lease.Until))
	// Output:
	// extended: true
}
