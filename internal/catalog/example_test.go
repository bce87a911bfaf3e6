package catalog_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/sqlitex"
	"github.com/credpool/credpool/optimistic"
)

// The broker's view of one request: resolve the model, list the pool's
// keys, read the one handed out (secret included), report a rate limit,
// recover once the cooldown has passed.
func Example() {
	dir, err := os.MkdirTemp("", "credpool-catalog-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlitex.Open(filepath.Join(dir, "credpool.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()

	ctx := context.Background()
	cat, err := catalog.New(ctx, db, nil)
	if err != nil {
		panic(err)
	}
	if err := cat.SetAlias(ctx, "openai", "gpt-4o", "gpt-4o-2024-08-06"); err != nil {
		panic(err)
	}
	if _, err := cat.Put(ctx, catalog.Key{
		ID: "key-1", Provider: "openai", Pool: "default",
		Models: []string{"gpt-4o-2024-08-06"}, Secret: "sk-example",
		Status: optimistic.StatusAvailable, MaxConcurrentUses: 2,
	}); err != nil {
		panic(err)
	}

	// The request path reads a Cache: memory, and one row to learn whether
	// the catalog changed.
	cache, err := catalog.NewCache(ctx, cat, nil)
	if err != nil {
		panic(err)
	}
	defer cache.Close(ctx)
	model, err := cache.ResolveModel(ctx, "openai", "gpt-4o")
	if err != nil {
		panic(err)
	}
	keys, err := cache.List(ctx, "openai", "default")
	if err != nil {
		panic(err)
	}
	k, err := cache.Get(ctx, keys[0].ID)
	if err != nil {
		panic(err)
	}
	fmt.Println(model, len(keys), k.ID, k.Supports(model), k.Secret)

	now := time.Now()
	k, err = cat.Report(ctx, "key-1", "lease-1", catalog.OutcomeRateLimited, 30*time.Second, now)
	if err != nil {
		panic(err)
	}
	fmt.Println(k.Status, k.CooldownUntil.Sub(now).Round(time.Second))

	recovered, err := cat.RecoverCooldown(ctx, "key-1", now.Add(time.Minute))
	if err != nil {
		panic(err)
	}
	fmt.Println(recovered)
	// Output:
	// gpt-4o-2024-08-06 1 key-1 true [redacted]
	// rate_limited 30s
	// true
}
