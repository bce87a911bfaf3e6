package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/client"
)

// Every answer the service gives a caller maps to its own error, which
// errors.Is and errors.As tell apart.
func TestErrorsTellAnswersApart(t *testing.T) {
	s := start(t)
	c, adm := clients(t, s, nil)
	putKey(t, adm, "k", 1)
	ctx := t.Context()

	_, err := c.Allocate(ctx, client.AllocateRequest{Provider: "nobody", Model: "m"})
	require.ErrorIs(t, err, client.ErrNoCandidates)
	_, err = c.Allocate(ctx, client.AllocateRequest{Provider: "openai", Model: "claude-3"})
	require.ErrorIs(t, err, client.ErrPolicyConflict)
	_, err = c.Allocate(ctx, client.AllocateRequest{Provider: "openai", Model: "m", Pool: "a/b"})
	require.ErrorIs(t, err, client.ErrInvalidRequest)
	var e *client.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, "pool", e.Field)
	require.Equal(t, http.StatusBadRequest, e.StatusCode)

	l, err := c.Allocate(ctx, request())
	require.NoError(t, err)
	require.Equal(t, "default", l.Pool)
	require.Equal(t, "gpt-4o-2024-08-06", l.Model)
	require.Equal(t, "sk-test-k", l.Credential.APIKey.Reveal())
	require.WithinDuration(t, time.Now().Add(testLease), l.Until, roundTrip)

	_, err = c.Allocate(ctx, request())
	require.ErrorIs(t, err, client.ErrPoolExhausted)
	require.NotErrorIs(t, err, client.ErrContended)
	require.ErrorAs(t, err, &e)
	require.Equal(t, time.Second, e.RetryAfter, "a held lease may free up at any moment")

	until, err := c.Renew(ctx, l.LeaseRef, time.Minute)
	require.NoError(t, err)
	require.True(t, until.After(l.Until))

	wrong := l.LeaseRef
	wrong.Pool = "vip"
	require.ErrorIs(t, c.Release(ctx, wrong), client.ErrLeaseMismatch)
	require.ErrorIs(t, c.Release(ctx, wrong), client.ErrLeaseLost, "a mismatch is a kind of loss")
	require.NoError(t, c.Release(ctx, l.LeaseRef))
	require.ErrorIs(t, c.Release(ctx, l.LeaseRef), client.ErrLeaseLost, "release is idempotent")
	require.ErrorIs(t, c.Report(ctx, l.LeaseRef, client.Success, 0), client.ErrLeaseLost)
	_, err = c.Renew(ctx, l.LeaseRef, 0)
	require.ErrorIs(t, err, client.ErrLeaseLost)
	require.ErrorAs(t, err, &e)
	require.Equal(t, http.StatusGone, e.StatusCode)

	bad, err := client.New(s.url, "wrong-key", nil)
	require.NoError(t, err)
	_, err = bad.Allocate(ctx, request())
	require.ErrorIs(t, err, client.ErrUnauthorized)
	_, err = adm.Key(ctx, "missing")
	require.ErrorIs(t, err, client.ErrKeyNotFound)
}

// One request id per Allocate call: the retries of a call share it, so a
// call holds at most one slot however many tries it takes, and a second
// call with the same id gets the same lease.
func TestAllocateRetriesWithOneRequestID(t *testing.T) {
	s := start(t)
	plain, adm := clients(t, s, nil)
	putKey(t, adm, "k", 1)
	ctx := t.Context()
	held, err := plain.Allocate(ctx, request())
	require.NoError(t, err)

	var pauses []time.Duration
	retrying, _ := clients(t, s, &client.Options{Retry: &client.Retry{
		MaxElapsed: time.Minute,
		OnRetry: func(err error, pause time.Duration) {
			// Runs on the caller's goroutine, between two tries: free the
			// slot once the first try was refused.
			require.ErrorIs(t, err, client.ErrPoolExhausted)
			pauses = append(pauses, pause)
			if len(pauses) == 1 {
				require.NoError(t, plain.Release(ctx, held.LeaseRef))
			}
		},
	}})
	l, err := retrying.Allocate(ctx, request())
	require.NoError(t, err)
	require.Len(t, pauses, 1)
	require.GreaterOrEqual(t, pauses[0], time.Second, "the pause honours Retry-After")
	require.Equal(t, 1, liveLeases(t, adm, "k"))

	again := request()
	again.RequestID = l.RequestID
	replay, err := plain.Allocate(ctx, again)
	require.NoError(t, err)
	require.Equal(t, l.LeaseID, replay.LeaseID, "the same request id answers the same lease")
	require.Equal(t, 1, liveLeases(t, adm, "k"), "and takes no second slot")

	// Full until the deadline: the last answer comes back once another
	// pause would pass it, without sleeping past it. The slot is held by
	// a lease that outlives the deadline many times over.
	require.NoError(t, plain.Release(ctx, l.LeaseRef))
	long := request()
	long.Lease = time.Minute
	_, err = plain.Allocate(ctx, long)
	require.NoError(t, err)
	bounded, _ := clients(t, s, &client.Options{Retry: &client.Retry{MaxElapsed: 2500 * time.Millisecond}})
	done := make(chan error, 1)
	go func() {
		_, err := bounded.Allocate(ctx, request())
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(2500*time.Millisecond + roundTrip):
		t.Fatal("a retried Allocate outlived its MaxElapsed")
	}
	require.ErrorIs(t, err, client.ErrPoolExhausted)
}

// The credential never prints: not with fmt's verbs, slog or JSON.
func TestCredentialIsRedacted(t *testing.T) {
	s := start(t)
	c, adm := clients(t, s, nil)
	putKey(t, adm, "k", 1)
	l, err := c.Allocate(t.Context(), request())
	require.NoError(t, err)
	const secret = "sk-test-k"
	require.Equal(t, secret, l.Credential.APIKey.Reveal())

	var out bytes.Buffer
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
		fmt.Fprintf(&out, verb+"\n", l)
		fmt.Fprintf(&out, verb+"\n", l.Credential)
		fmt.Fprintf(&out, verb+"\n", l.Credential.APIKey)
	}
	fmt.Fprintln(&out, l, &l)
	for _, h := range []slog.Handler{slog.NewJSONHandler(&out, nil), slog.NewTextHandler(&out, nil)} {
		slog.New(h).Info("leased", "lease", l, "credential", l.Credential, "key", l.Credential.APIKey)
	}
	raw, err := json.Marshal(l)
	require.NoError(t, err)
	out.Write(raw)
	require.NotContains(t, out.String(), secret)
	require.NotContains(t, out.String(), fmt.Sprintf("%x", secret))
	require.Contains(t, out.String(), "[redacted]")
}

func TestAdminKeys(t *testing.T) {
	s := start(t)
	c, adm := clients(t, s, nil)
	ctx := t.Context()
	spec := putKey(t, adm, "k", 2)
	spec.LastVerifiedAt = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	k, err := adm.PutKey(ctx, "k", spec)
	require.NoError(t, err)
	require.Equal(t, spec.LastVerifiedAt, k.LastVerifiedAt.UTC())
	require.Equal(t, 2, k.MaxConcurrentUses)
	cooling, disabled := spec, spec
	cooling.Status, cooling.CooldownUntil = "cooldown", time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	disabled.Status, disabled.CooldownUntil = "disabled", cooling.CooldownUntil
	k, err = adm.PutKey(ctx, "k", cooling)
	require.NoError(t, err)
	require.Equal(t, cooling.CooldownUntil, k.CooldownUntil.UTC())
	k, err = adm.PutKey(ctx, "k", disabled)
	require.NoError(t, err)
	require.Nil(t, k.CooldownUntil, "read only with rate_limited or cooldown")
	k, err = adm.PutKey(ctx, "k", spec)
	require.NoError(t, err)

	require.NoError(t, adm.SetAlias(ctx, "openai", "fast", "gpt-4o-2024-08-06"))
	l, err := c.Allocate(ctx, client.AllocateRequest{Provider: "openai", Model: "fast"})
	require.NoError(t, err)
	require.Equal(t, "gpt-4o-2024-08-06", l.Model, "the alias is resolved")
	keys, err := adm.Keys(ctx)
	require.NoError(t, err)
	require.Len(t, keys, 1)
	require.Equal(t, 1, keys[0].LiveLeases)
	n, err := adm.ClearLeases(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = adm.Sync(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, adm.DeleteKey(ctx, "k"))
	require.ErrorIs(t, adm.DeleteKey(ctx, "k"), client.ErrKeyNotFound)
	_, err = adm.PutKey(ctx, "k", client.KeySpec{Provider: "openai", Pool: "default", Models: []string{"m"}})
	require.ErrorIs(t, err, client.ErrInvalidRequest, "a key needs a secret")

	// Several keys at once, all or none.
	bad := spec
	bad.Secret = ""
	err = adm.PutKeys(ctx, []client.KeyPut{{ID: "b1", KeySpec: spec}, {ID: "b2", KeySpec: bad}})
	require.ErrorIs(t, err, client.ErrInvalidRequest)
	keys, err = adm.Keys(ctx)
	require.NoError(t, err)
	require.Empty(t, keys, "none written")
	require.NoError(t, adm.PutKeys(ctx, []client.KeyPut{{ID: "b1", KeySpec: spec}, {ID: "b2", KeySpec: spec}}))
	keys, err = adm.Keys(ctx)
	require.NoError(t, err)
	require.Len(t, keys, 2)
	require.True(t, keys[1].InStore)
}

// A key is disabled without its secret, and takes no lease once that
// returns; its secret and counters stay.
func TestAdminUpdateKey(t *testing.T) {
	s := start(t)
	c, adm := clients(t, s, nil)
	ctx := t.Context()
	putKey(t, adm, "k", 2)
	held, err := c.Allocate(ctx, request())
	require.NoError(t, err)
	require.NoError(t, c.Report(ctx, held.LeaseRef, client.Success, 0))
	held, err = c.Allocate(ctx, request())
	require.NoError(t, err)

	disabled := "disabled"
	k, err := adm.UpdateKey(ctx, "k", client.KeyUpdate{Status: &disabled})
	require.NoError(t, err)
	require.Equal(t, "disabled", k.Status)
	require.Equal(t, 2, k.MaxConcurrentUses, "kept")
	_, err = c.Allocate(ctx, request())
	require.ErrorIs(t, err, client.ErrPolicyConflict, "no lease once disabled")
	require.NoError(t, c.Release(ctx, held.LeaseRef), "a lease held before is released as usual")

	available, limit := "available", 3
	k, err = adm.UpdateKey(ctx, "k", client.KeyUpdate{Status: &available, MaxConcurrentUses: &limit})
	require.NoError(t, err)
	require.Equal(t, 3, k.MaxConcurrentUses)
	l, err := c.Allocate(ctx, request())
	require.NoError(t, err)
	require.Equal(t, "sk-test-k", l.Credential.APIKey.Reveal(), "the secret is kept")
	require.NoError(t, c.Release(ctx, l.LeaseRef))

	_, err = adm.UpdateKey(ctx, "nope", client.KeyUpdate{Status: &disabled})
	require.ErrorIs(t, err, client.ErrKeyNotFound)
	var apiErr *client.Error
	_, err = adm.UpdateKey(ctx, "k", client.KeyUpdate{})
	require.ErrorIs(t, err, client.ErrInvalidRequest)
	require.ErrorContains(t, err, "want a field to change")
	zero := 0
	_, err = adm.UpdateKey(ctx, "k", client.KeyUpdate{MaxConcurrentUses: &zero})
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, "max_concurrent_uses", apiErr.Field)
	until := time.Now().Add(time.Hour)
	for _, u := range []client.KeyUpdate{{CooldownUntil: &until}, {Status: &available, CooldownUntil: &until}} {
		_, err = adm.UpdateKey(ctx, "k", u)
		require.ErrorAs(t, err, &apiErr)
		require.Equal(t, "cooldown_until", apiErr.Field)
	}
	_, err = adm.UpdateKey(ctx, "k", client.KeyUpdate{Models: []string{}})
	require.ErrorAs(t, err, &apiErr, "an empty list is sent, not left out")
	require.Equal(t, "models", apiErr.Field)
}

// Aliases are listed and deleted as they are set, and an alias comes
// before a model of its name until it is deleted.
func TestAdminAliases(t *testing.T) {
	s := start(t)
	c, adm := clients(t, s, nil)
	ctx := t.Context()
	putKey(t, adm, "k", 2)
	list := func() []client.Alias {
		t.Helper()
		all, err := adm.Aliases(ctx)
		require.NoError(t, err)
		return all
	}
	require.Empty(t, list())

	require.NoError(t, adm.SetAlias(ctx, "openai", "meta/llama", "gpt-4o-2024-08-06"))
	require.NoError(t, adm.SetAlias(ctx, "openai", "gpt-4o-2024-08-06", "gpt-5"))
	require.Equal(t, []client.Alias{
		{Provider: "openai", Alias: "gpt-4o-2024-08-06", Model: "gpt-5"},
		{Provider: "openai", Alias: "meta/llama", Model: "gpt-4o-2024-08-06"},
	}, list())

	req := request()
	_, err := c.Allocate(ctx, req)
	require.ErrorIs(t, err, client.ErrPolicyConflict, "the alias comes before the model of its name")
	require.Contains(t, err.Error(), "gpt-5", "the answer names the model the alias resolved to")
	require.NoError(t, adm.DeleteAlias(ctx, "openai", "gpt-4o-2024-08-06"))
	l, err := c.Allocate(ctx, req)
	require.NoError(t, err, "the model is reached again")
	require.Equal(t, "k", l.KeyID)

	require.NoError(t, adm.DeleteAlias(ctx, "openai", "meta/llama"), "a / in an alias is escaped")
	require.Empty(t, list())
	err = adm.DeleteAlias(ctx, "openai", "meta/llama")
	require.ErrorIs(t, err, client.ErrAliasNotFound)
	require.NotErrorIs(t, err, client.ErrKeyNotFound)
	err = adm.DeleteAlias(ctx, "openai", "two words")
	require.ErrorIs(t, err, client.ErrInvalidRequest)
	var apiErr *client.Error
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, "alias", apiErr.Field)
}

func TestNewRefusesBadConfig(t *testing.T) {
	for _, u := range []string{"", "localhost:8080", "ftp://host", "http://"} {
		_, err := client.New(u, internalKey, nil)
		require.Error(t, err, u)
	}
	_, err := client.New("http://127.0.0.1:8080", "", nil)
	require.Error(t, err)
	_, err = client.NewAdmin("http://127.0.0.1:8080", "", nil)
	require.Error(t, err)
}

// A request id the caller chose is sent on every try and kept in the
// lease; a call without one gets a fresh one.
func TestRequestIDs(t *testing.T) {
	s := start(t)
	c, adm := clients(t, s, nil)
	putKey(t, adm, "k", 3)
	ctx := context.Background()
	a, err := c.Allocate(ctx, request())
	require.NoError(t, err)
	b, err := c.Allocate(ctx, request())
	require.NoError(t, err)
	require.NotEqual(t, a.RequestID, b.RequestID)
	require.NotEqual(t, a.LeaseID, b.LeaseID)
	mine := request()
	mine.RequestID = "job-42"
	m, err := c.Allocate(ctx, mine)
	require.NoError(t, err)
	require.Equal(t, "job-42", m.RequestID)
	reused := mine
	reused.Pool = "vip"
	_, err = c.Allocate(ctx, reused)
	require.ErrorIs(t, err, client.ErrRequestIDReused)
}

// A waiting Allocate gets the slot another caller releases, even when the
// wait outlasts the client's per-request Timeout (the wait extends it);
// a wait that runs out is ErrPoolExhausted.
func TestAllocateWaits(t *testing.T) {
	s := start(t)
	c, _ := clients(t, s, &client.Options{Timeout: roundTrip})
	holder, adm := clients(t, s, nil)
	putKey(t, adm, "k", 1)
	held, err := holder.Allocate(t.Context(), request())
	require.NoError(t, err)

	short := request()
	short.Wait = 20 * time.Millisecond
	_, err = c.Allocate(t.Context(), short)
	require.ErrorIs(t, err, client.ErrPoolExhausted)

	long := request()
	long.Wait = 4 * roundTrip
	done := make(chan error, 1)
	var got client.Lease
	go func() {
		var err error
		got, err = c.Allocate(t.Context(), long)
		done <- err
	}()
	// Longer than the client's Timeout: only the wait keeps the try alive.
	time.Sleep(roundTrip + 500*time.Millisecond)
	require.NoError(t, holder.Release(t.Context(), held.LeaseRef))
	require.NoError(t, <-done)
	require.Equal(t, "k", got.KeyID)
	require.NotEqual(t, held.LeaseID, got.LeaseID)
}
