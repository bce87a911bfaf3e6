package handlers

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/optimistic"
)

type adminAPI struct {
	admin Admin
}

// putKeyRequest is the body of PUT /api/admin/keys/{id}.
type putKeyRequest struct {
	Provider          string            `json:"provider"`
	Pool              string            `json:"pool"`
	Models            []string          `json:"models"`
	Secret            string            `json:"secret"`
	Status            optimistic.Status `json:"status"`
	CooldownUntil     *time.Time        `json:"cooldown_until"`
	MaxConcurrentUses *int              `json:"max_concurrent_uses"`
	LastVerifiedAt    *time.Time        `json:"last_verified_at"`
}

// keyView is a key as the admin API shows it. It has no secret field.
type keyView struct {
	ID                string            `json:"id"`
	Provider          string            `json:"provider"`
	Pool              string            `json:"pool"`
	Models            []string          `json:"models"`
	Status            optimistic.Status `json:"status"`
	CooldownUntil     *time.Time        `json:"cooldown_until,omitempty"`
	MaxConcurrentUses int               `json:"max_concurrent_uses"`
	LiveLeases        int               `json:"live_leases"`
	NextFreeAt        *time.Time        `json:"next_free_at,omitempty"`
	InStore           bool              `json:"in_store"`
	HeldUntil         *time.Time        `json:"held_until,omitempty"`
	LastUsedAt        *time.Time        `json:"last_used_at,omitempty"`
	LastVerifiedAt    *time.Time        `json:"last_verified_at,omitempty"`
	Successes         int64             `json:"successes"`
	Errors            int64             `json:"errors"`
	RateLimitHits     int64             `json:"rate_limit_hits"`
	CreatedAt         *time.Time        `json:"created_at,omitempty"`
	UpdatedAt         *time.Time        `json:"updated_at,omitempty"`
}

func viewOf(v broker.KeyView) keyView {
	return keyView{
		ID: v.ID, Provider: v.Provider, Pool: v.Pool, Models: v.Models, Status: v.Status,
		CooldownUntil: opt(v.CooldownUntil), MaxConcurrentUses: v.MaxConcurrentUses,
		LiveLeases: v.Live, NextFreeAt: opt(v.FreeAt), InStore: v.InStore, HeldUntil: opt(v.HeldUntil),
		LastUsedAt: opt(v.LastUsedAt), LastVerifiedAt: opt(v.LastVerifiedAt),
		Successes: v.Successes, Errors: v.Errors, RateLimitHits: v.RateLimitHits,
		CreatedAt: opt(v.CreatedAt), UpdatedAt: opt(v.UpdatedAt),
	}
}

// opt omits zero times from JSON.
func opt(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func (a adminAPI) put(c *gin.Context) {
	id := param(c, "id")
	if !validID(c, "id", id) {
		return
	}
	c.Set(logKeyID, id)
	var req putKeyRequest
	if !decode(c, &req) {
		return
	}
	k, ok := req.key(c, "", id)
	if !ok {
		return
	}
	if _, err := a.admin.Put(c.Request.Context(), k); err != nil {
		failErr(c, err)
		return
	}
	a.respondKey(c, id)
}

// patchKeyRequest is PATCH /api/admin/keys/{id}'s body: the fields to
// change, the others kept. No secret or provider: those need a PUT.
type patchKeyRequest struct {
	Pool              *string            `json:"pool"`
	Models            []string           `json:"models"`
	Status            *optimistic.Status `json:"status"`
	CooldownUntil     *time.Time         `json:"cooldown_until"`
	MaxConcurrentUses *int               `json:"max_concurrent_uses"`
}

func (a adminAPI) update(c *gin.Context) {
	id := param(c, "id")
	if !validID(c, "id", id) {
		return
	}
	c.Set(logKeyID, id)
	var req patchKeyRequest
	if !decode(c, &req) {
		return
	}
	p, ok := req.patch(c)
	if !ok {
		return
	}
	if _, err := a.admin.Update(c.Request.Context(), id, p); err != nil {
		failErr(c, err)
		return
	}
	a.respondKey(c, id)
}

// patch is the catalog patch req asks for; on a bad field it has written
// the 400 naming it, and returns false.
func (req patchKeyRequest) patch(c *gin.Context) (catalog.Patch, bool) {
	switch {
	case req.CooldownUntil != nil && !catalog.Cools(req.Status):
		invalid(c, "cooldown_until", "want it with status rate_limited or cooldown")
		return catalog.Patch{}, false
	case req.Pool == nil && req.Models == nil && req.Status == nil && req.MaxConcurrentUses == nil:
		fail(c, http.StatusBadRequest, "invalid_request",
			"want a field to change: pool, models, status (with cooldown_until) or max_concurrent_uses; the secret and provider change only by PUT", "")
		return catalog.Patch{}, false
	case req.Status != nil && !req.Status.Valid():
		invalid(c, "status", "want available, pending, disabled, exhausted, rate_limited or cooldown")
		return catalog.Patch{}, false
	case req.Pool != nil && !validID(c, "pool", *req.Pool):
		return catalog.Patch{}, false
	case req.Models != nil && len(req.Models) == 0:
		invalid(c, "models", "want at least one model")
		return catalog.Patch{}, false
	case req.MaxConcurrentUses != nil && *req.MaxConcurrentUses < 1:
		invalid(c, "max_concurrent_uses", "want at least 1")
		return catalog.Patch{}, false
	}
	for i, m := range req.Models {
		if catalog.CheckModel("model", m) != nil {
			invalid(c, fmt.Sprintf("models[%d]", i), modelRule)
			return catalog.Patch{}, false
		}
	}
	return catalog.Patch{
		Pool: req.Pool, Models: req.Models, Status: req.Status,
		CooldownUntil: req.CooldownUntil, MaxConcurrentUses: req.MaxConcurrentUses,
	}, true
}

// key is the catalog key req asks to write as id; on a bad field it has
// written the 400, its field named with prefix, and returns false.
func (req putKeyRequest) key(c *gin.Context, prefix, id string) (catalog.Key, bool) {
	if req.Status == "" {
		req.Status = optimistic.StatusAvailable
	}
	if !req.Status.Valid() {
		invalid(c, prefix+"status", "want available, pending, disabled, exhausted, rate_limited or cooldown")
		return catalog.Key{}, false
	}
	if strings.TrimSpace(string(req.Secret)) == "" {
		invalid(c, prefix+"secret", "required, not blank")
		return catalog.Key{}, false
	}
	// The catalog checks these too; here the answer names the field.
	if !validID(c, prefix+"provider", req.Provider) || !validID(c, prefix+"pool", req.Pool) {
		return catalog.Key{}, false
	}
	if len(req.Models) == 0 {
		invalid(c, prefix+"models", "want at least one model")
		return catalog.Key{}, false
	}
	for i, m := range req.Models {
		if catalog.CheckModel("model", m) != nil {
			invalid(c, fmt.Sprintf("%smodels[%d]", prefix, i), "want 1-256 characters, no spaces, commas or control characters")
			return catalog.Key{}, false
		}
	}
	if req.MaxConcurrentUses != nil && *req.MaxConcurrentUses < 1 {
		invalid(c, prefix+"max_concurrent_uses", "want at least 1")
		return catalog.Key{}, false
	}
	k := catalog.Key{
		ID: id, Provider: req.Provider, Pool: req.Pool, Models: req.Models,
		Secret: catalog.Secret(req.Secret), Status: req.Status, MaxConcurrentUses: 1,
	}
	if req.MaxConcurrentUses != nil {
		k.MaxConcurrentUses = *req.MaxConcurrentUses
	}
	if req.CooldownUntil != nil && catalog.Cools(&k.Status) {
		// Read only with the statuses it goes with, as documented.
		k.CooldownUntil = *req.CooldownUntil
	}
	if req.LastVerifiedAt != nil {
		k.LastVerifiedAt = *req.LastVerifiedAt
	}
	return k, true
}

// Bounds of PUT /api/admin/keys: keys per request, and the body (a key's
// secret and models take a few hundred bytes).
const (
	maxPutKeys  = 1000
	maxBulkBody = 4 << 20
)

// putKeysItem is one key of PUT /api/admin/keys: the body of
// PUT /api/admin/keys/{id} with its id.
type putKeysItem struct {
	ID string `json:"id"`
	putKeyRequest
}

// putMany writes every key of the body or none: each is checked here and
// by the catalog before any is written, in one transaction.
func (a adminAPI) putMany(c *gin.Context) {
	req, ok := decodeItems[putKeysItem](c, maxBulkBody)
	if !ok {
		return
	}
	if len(req) == 0 || len(req) > maxPutKeys {
		fail(c, http.StatusBadRequest, "invalid_request", fmt.Sprintf("want 1 to %d keys", maxPutKeys), "")
		return
	}
	keys := make([]catalog.Key, len(req))
	seen := make(map[string]int, len(req))
	for i, r := range req {
		prefix := fmt.Sprintf("[%d].", i)
		if !validID(c, prefix+"id", r.ID) {
			return
		}
		if j, ok := seen[r.ID]; ok {
			invalid(c, prefix+"id", fmt.Sprintf("repeats [%d]", j))
			return
		}
		seen[r.ID] = i
		k, ok := r.key(c, prefix, r.ID)
		if !ok {
			return
		}
		keys[i] = k
	}
	stored, err := a.admin.PutMany(c.Request.Context(), keys...)
	if err != nil {
		failErr(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"written": len(stored)})
}

func (a adminAPI) get(c *gin.Context) {
	id := param(c, "id")
	if !validID(c, "id", id) {
		return
	}
	c.Set(logKeyID, id)
	a.respondKey(c, id)
}

func (a adminAPI) respondKey(c *gin.Context, id string) {
	v, err := a.admin.Key(c.Request.Context(), id)
	if err != nil {
		failErr(c, err)
		return
	}
	c.JSON(http.StatusOK, viewOf(v))
}

func (a adminAPI) list(c *gin.Context) {
	views, err := a.admin.Keys(c.Request.Context())
	if err != nil {
		failErr(c, err)
		return
	}
	out := make([]keyView, len(views))
	for i, v := range views {
		out[i] = viewOf(v)
	}
	c.JSON(http.StatusOK, gin.H{"keys": out})
}

func (a adminAPI) delete(c *gin.Context) {
	id := param(c, "id")
	if !validID(c, "id", id) {
		return
	}
	c.Set(logKeyID, id)
	if err := a.admin.Delete(c.Request.Context(), id); err != nil {
		failErr(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"deleted": id})
}

func (a adminAPI) clearLeases(c *gin.Context) {
	id := param(c, "id")
	if !validID(c, "id", id) {
		return
	}
	c.Set(logKeyID, id)
	n, err := a.admin.ClearLeases(c.Request.Context(), id)
	if err != nil {
		failErr(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"cleared": n})
}

func (a adminAPI) sync(c *gin.Context) {
	n, err := a.admin.Sync(c.Request.Context())
	if err != nil {
		failErr(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"synced": n})
}

func (a adminAPI) setAlias(c *gin.Context) {
	var req struct {
		Model string `json:"model"`
	}
	if !decode(c, &req) {
		return
	}
	provider, alias, ok := aliasParams(c)
	if !ok {
		return
	}
	if catalog.CheckModel("model", req.Model) != nil {
		invalid(c, "model", modelRule)
		return
	}
	if err := a.admin.SetAlias(c.Request.Context(), provider, alias, req.Model); err != nil {
		failErr(c, err)
		return
	}
	c.JSON(http.StatusOK, aliasView{Provider: provider, Alias: alias, Model: req.Model})
}

func (a adminAPI) deleteAlias(c *gin.Context) {
	provider, alias, ok := aliasParams(c)
	if !ok {
		return
	}
	if err := a.admin.DeleteAlias(c.Request.Context(), provider, alias); err != nil {
		failErr(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"provider": provider, "deleted": alias})
}

func (a adminAPI) aliases(c *gin.Context) {
	all, err := a.admin.Aliases(c.Request.Context())
	if err != nil {
		failErr(c, err)
		return
	}
	out := make([]aliasView, len(all))
	for i, al := range all {
		out[i] = aliasView{Provider: al.Provider, Alias: al.Name, Model: al.Model}
	}
	c.JSON(http.StatusOK, gin.H{"aliases": out})
}

// aliasView is an alias on the wire.
type aliasView struct {
	Provider string `json:"provider"`
	Alias    string `json:"alias"`
	Model    string `json:"model"`
}

// modelRule is what a 400 for a model or alias says it wants.
const modelRule = "required, at most 256 characters, no spaces, commas or control characters"

// aliasParams reads and checks the path's provider and alias, answering a
// 400 that names the bad one. The catalog checks them too; here the
// answer names the field.
func aliasParams(c *gin.Context) (provider, alias string, ok bool) {
	provider, alias = param(c, "provider"), param(c, "alias")
	if !validID(c, "provider", provider) {
		return "", "", false
	}
	if catalog.CheckModel("alias", alias) != nil {
		invalid(c, "alias", modelRule)
		return "", "", false
	}
	return provider, alias, true
}

// param is c's path parameter name as the caller meant it: gin leaves the
// parameters of a path matched raw (one holding an escape such as %2F)
// escaped, and those of any other path unescaped.
func param(c *gin.Context, name string) string {
	v := c.Param(name)
	if c.Request.URL.RawPath != "" {
		// Its escapes are valid: net/url keeps no RawPath otherwise.
		v, _ = url.PathUnescape(v)
	}
	return v
}
