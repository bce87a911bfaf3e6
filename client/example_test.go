package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/credpool/credpool/client"
)

// Hold allocates, renews while the work runs, and reports (so releases)
// however the work ends; an upstream 429 becomes a cooldown of the key.
func ExampleClient_Hold() {
	c, err := client.New(os.Getenv("CREDPOOL_URL"), os.Getenv("CREDPOOL_INTERNAL_KEY"), &client.Options{
		Retry: &client.Retry{MaxElapsed: 30 * time.Second}, // wait out a full pool
	})
	if err != nil {
		log.Fatal(err)
	}
	req := client.AllocateRequest{Provider: "openai", Model: "gpt-4o", Lease: time.Minute}
	err = c.Hold(context.Background(), req, func(ctx context.Context, l client.Lease) error {
		// ctx ends the moment the lease is lost: stop using the key then.
		fmt.Println("calling", l.Model, "with", l.Credential.APIKey)
		upstream, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://upstream.example/v1/models", nil)
		if err != nil {
			return err
		}
		upstream.Header.Set("Authorization", "Bearer "+l.Credential.APIKey.Reveal())
		// Send it with your HTTP client and return client.CheckResponse(resp):
		// 429 → rate_limited with its Retry-After, 401/403 → auth_error.
		return nil
	})
	fmt.Println("held and released:", err == nil)
	// Output:
	// calling gpt-4o-2024-08-06 with [redacted]
	// held and released: true
}

// The calls one by one, for callers that manage the lease themselves.
func ExampleClient_Allocate() {
	c, err := client.New(os.Getenv("CREDPOOL_URL"), os.Getenv("CREDPOOL_INTERNAL_KEY"), nil)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	l, err := c.Allocate(ctx, client.AllocateRequest{Provider: "openai", Model: "gpt-4o", Lease: 30 * time.Second})
	var e *client.Error
	switch {
	case errors.Is(err, client.ErrPoolExhausted) && errors.As(err, &e):
		fmt.Println("full; try again in", e.RetryAfter)
		return
	case errors.Is(err, client.ErrNoCandidates), errors.Is(err, client.ErrPolicyConflict):
		fmt.Println("no key serves this; do not retry")
		return
	case err != nil:
		log.Fatal(err)
	}
	fmt.Println("granted", l.KeyID, "from pool", l.Pool)

	if _, err := c.Renew(ctx, l.LeaseRef, 30*time.Second); errors.Is(err, client.ErrLeaseLost) {
		fmt.Println("lost: stop using the key")
	}
	err = c.Report(ctx, l.LeaseRef, client.Success, 0) // releases the lease
	fmt.Println("reported:", err == nil)
	err = c.Release(ctx, l.LeaseRef)
	fmt.Println("released again:", !errors.Is(err, client.ErrLeaseLost))
	// Output:
	// granted example-1 from pool default
	// reported: true
	// released again: false
}

// Keys are put through the admin API; the secret is never shown again.
func ExampleAdmin_PutKey() {
	adm, err := client.NewAdmin(os.Getenv("CREDPOOL_URL"), os.Getenv("CREDPOOL_ADMIN_KEY"), nil)
	if err != nil {
		log.Fatal(err)
	}
	k, err := adm.PutKey(context.Background(), "example-2", client.KeySpec{
		Provider: "anthropic", Pool: "default", Models: []string{"claude-sonnet-4"},
		Secret: client.Secret("sk-ant-example"), MaxConcurrentUses: 4,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(k.ID, k.Provider, k.Status, k.MaxConcurrentUses, k.InStore)
	// Output:
	// example-2 anthropic available 4 true
}
