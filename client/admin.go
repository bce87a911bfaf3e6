package client

import (
	"context"
	"net/url"
	"time"
)

// Admin calls the service's admin API (X-Admin-Key): keys and aliases. It
// is safe for concurrent use.
type Admin struct {
	conn
}

// NewAdmin returns an Admin of the service at baseURL that sends adminKey.
// opts may be nil; its Retry and Hold fields do not apply.
func NewAdmin(baseURL, adminKey string, opts *Options) (*Admin, error) {
	c, err := newConn(baseURL, "X-Admin-Key", adminKey, opts.withDefaults())
	if err != nil {
		return nil, err
	}
	return &Admin{conn: c}, nil
}

// KeySpec is a key as PutKey writes it. A put replaces every field: one
// left zero takes its default, not the stored value.
type KeySpec struct {
	Provider string `json:"provider"`
	Pool     string `json:"pool"`
	// Models are the canonical models the key serves; at least one.
	Models []string `json:"models"`
	// Secret is the upstream credential, sealed by the service and never
	// shown again.
	Secret Secret `json:"-"`
	// Status is available, pending, disabled, exhausted, rate_limited or
	// cooldown.
	//
	// default: available
	Status string `json:"status,omitempty"`
	// MaxConcurrentUses is how many leases the key allows at once.
	//
	// default: 1
	MaxConcurrentUses int `json:"max_concurrent_uses,omitempty"`
	// CooldownUntil is when a rate_limited or cooldown key may be used
	// again; zero: none.
	CooldownUntil time.Time `json:"-"`
	// LastVerifiedAt is when the key was last checked upstream (it ranks
	// fresher keys higher); zero: never.
	LastVerifiedAt time.Time `json:"-"`
}

// Key is a key as the admin API shows it: never its secret.
type Key struct {
	ID                string     `json:"id"`
	Provider          string     `json:"provider"`
	Pool              string     `json:"pool"`
	Models            []string   `json:"models"`
	Status            string     `json:"status"`
	CooldownUntil     *time.Time `json:"cooldown_until,omitempty"`
	MaxConcurrentUses int        `json:"max_concurrent_uses"`
	// LiveLeases are the leases held now, NextFreeAt the earliest one's
	// expiry, InStore whether the lease store has the key.
	LiveLeases int        `json:"live_leases"`
	NextFreeAt *time.Time `json:"next_free_at,omitempty"`
	InStore    bool       `json:"in_store"`
	// HeldUntil, if set, is when a key held back takes leases again: a
	// lease store lost its leases (Redis lost its data, or the service
	// moved to another store), which may still be in use.
	// Until then the key grants nothing, whatever its Status says.
	// ClearLeases, the operator's word that none is in use, lifts the
	// catalog's hold; one the Redis store keeps itself ends at its time.
	HeldUntil      *time.Time `json:"held_until,omitempty"`
	LastUsedAt     *time.Time `json:"last_used_at,omitempty"`
	LastVerifiedAt *time.Time `json:"last_verified_at,omitempty"`
	Successes      int64      `json:"successes"`
	Errors         int64      `json:"errors"`
	RateLimitHits  int64      `json:"rate_limit_hits"`
	CreatedAt      *time.Time `json:"created_at,omitempty"`
	UpdatedAt      *time.Time `json:"updated_at,omitempty"`
}

// Keys lists every key.
func (a *Admin) Keys(ctx context.Context) ([]Key, error) {
	var out struct {
		Keys []Key `json:"keys"`
	}
	err := a.do(ctx, "GET", "/api/admin/keys", nil, &out)
	return out.Keys, err
}

// Key returns one key; ErrKeyNotFound if there is none.
func (a *Admin) Key(ctx context.Context, id string) (Key, error) {
	var k Key
	err := a.do(ctx, "GET", "/api/admin/keys/"+url.PathEscape(id), nil, &k)
	return k, err
}

// PutKey creates or replaces key id and syncs the lease store; it returns
// the key as stored. On ErrInvalidRequest nothing is written.
func (a *Admin) PutKey(ctx context.Context, id string, k KeySpec) (Key, error) {
	var out Key
	err := a.do(ctx, "PUT", "/api/admin/keys/"+url.PathEscape(id), putBody(k), &out)
	return out, err
}

// KeyUpdate is what UpdateKey changes of a key; a nil field is kept. The
// secret and provider change only by PutKey.
type KeyUpdate struct {
	Pool *string
	// Models, if not nil, replace the key's (an empty list is refused).
	Models []string
	// Status replaces the key's status and cooldown together:
	// CooldownUntil goes only with rate_limited or cooldown, and a Status
	// without it clears the cooldown.
	Status            *string
	CooldownUntil     *time.Time
	MaxConcurrentUses *int
}

// UpdateKey changes the fields u sets of key id, without its secret, and
// syncs the lease store; it returns the key as stored. Once it returns, a
// key it disabled takes no new lease, and the next renewal of a lease
// already held fails with ErrLeaseLost. ErrKeyNotFound if there is none.
func (a *Admin) UpdateKey(ctx context.Context, id string, u KeyUpdate) (Key, error) {
	body := struct {
		Pool              *string    `json:"pool,omitempty"`
		Models            *[]string  `json:"models,omitempty"`
		Status            *string    `json:"status,omitempty"`
		CooldownUntil     *time.Time `json:"cooldown_until,omitempty"`
		MaxConcurrentUses *int       `json:"max_concurrent_uses,omitempty"`
	}{Pool: u.Pool, Status: u.Status, CooldownUntil: u.CooldownUntil, MaxConcurrentUses: u.MaxConcurrentUses}
	if u.Models != nil {
		// Sent even when empty: the service names it in its 400.
		body.Models = &u.Models
	}
	var out Key
	err := a.do(ctx, "PATCH", "/api/admin/keys/"+url.PathEscape(id), body, &out)
	return out, err
}

// MaxPutKeys is the most keys one PutKeys takes.
const MaxPutKeys = 1000

// KeyPut is one key of PutKeys: its id and what to write.
type KeyPut struct {
	ID string
	KeySpec
}

// PutKeys creates or replaces up to MaxPutKeys keys at once, all or none:
// the service checks every key, writes them in one transaction, then syncs
// the lease store. On ErrInvalidRequest nothing is written. After an error
// that may come once the write is done (ErrStoreUnavailable or ErrContended
// from the sync, ErrTimeout, ErrOutcomeUnknown) either every key is
// written or none is; Sync then brings the lease store up to date.
func (a *Admin) PutKeys(ctx context.Context, keys []KeyPut) error {
	type item struct {
		ID string `json:"id"`
		keyBody
	}
	body := make([]item, len(keys))
	for i, k := range keys {
		body[i] = item{ID: k.ID, keyBody: putBody(k.KeySpec)}
	}
	return a.do(ctx, "PUT", "/api/admin/keys", body, nil)
}

// keyBody is a KeySpec as the service reads it: the secret revealed.
type keyBody struct {
	KeySpec
	Secret         string     `json:"secret"`
	CooldownUntil  *time.Time `json:"cooldown_until,omitempty"`
	LastVerifiedAt *time.Time `json:"last_verified_at,omitempty"`
}

func putBody(k KeySpec) keyBody {
	return keyBody{KeySpec: k, Secret: k.Secret.Reveal(), CooldownUntil: optTime(k.CooldownUntil), LastVerifiedAt: optTime(k.LastVerifiedAt)}
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// DeleteKey removes key id from the catalog and the lease store; its
// holders lose their leases. ErrKeyNotFound if there is none.
func (a *Admin) DeleteKey(ctx context.Context, id string) error {
	return a.do(ctx, "DELETE", "/api/admin/keys/"+url.PathEscape(id), nil, nil)
}

// ClearLeases force-releases every lease of key id and returns how many.
func (a *Admin) ClearLeases(ctx context.Context, id string) (int, error) {
	var out struct {
		Cleared int `json:"cleared"`
	}
	err := a.do(ctx, "POST", "/api/admin/keys/"+url.PathEscape(id)+"/clear-leases", nil, &out)
	return out.Cleared, err
}

// Sync rewrites the lease store's state of every catalog key and returns
// how many.
func (a *Admin) Sync(ctx context.Context) (int, error) {
	var out struct {
		Synced int `json:"synced"`
	}
	err := a.do(ctx, "POST", "/api/admin/sync", nil, &out)
	return out.Synced, err
}

// Alias is a model alias: requests of Provider for Alias get keys serving
// Model.
type Alias struct {
	Provider string `json:"provider"`
	Alias    string `json:"alias"`
	Model    string `json:"model"`
}

// SetAlias makes requests of provider for alias get keys serving model,
// replacing the alias's earlier target. An alias comes before a model of
// the same name.
func (a *Admin) SetAlias(ctx context.Context, provider, alias, model string) error {
	body := struct {
		Model string `json:"model"`
	}{model}
	return a.do(ctx, "PUT", aliasPath(provider, alias), body, nil)
}

// DeleteAlias removes provider's alias: requests for it then get keys
// serving a model of that name. ErrAliasNotFound if there is none.
func (a *Admin) DeleteAlias(ctx context.Context, provider, alias string) error {
	return a.do(ctx, "DELETE", aliasPath(provider, alias), nil, nil)
}

// Aliases returns every alias, by provider then alias.
func (a *Admin) Aliases(ctx context.Context) ([]Alias, error) {
	var out struct {
		Aliases []Alias `json:"aliases"`
	}
	err := a.do(ctx, "GET", "/api/admin/aliases", nil, &out)
	return out.Aliases, err
}

// aliasPath is an alias's route; an alias may hold a "/", sent escaped.
func aliasPath(provider, alias string) string {
	return "/api/admin/aliases/" + url.PathEscape(provider) + "/" + url.PathEscape(alias)
}
