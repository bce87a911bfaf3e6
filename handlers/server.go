// Package handlers is credpool's HTTP API on gin: routes, key checks,
// request validation, JSON shapes, and the one mapping from errors to
// status codes (statusFor).
package handlers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/optimistic"
)

// Service is what the internal API needs from the broker.
type Service interface {
	Allocate(ctx context.Context, req broker.Request) (broker.Grant, error)
	Release(ctx context.Context, ref optimistic.LeaseRef) error
	Renew(ctx context.Context, ref optimistic.LeaseRef, ttl time.Duration) (time.Time, error)
	Report(ctx context.Context, ref optimistic.LeaseRef, o catalog.Outcome, retryAfter time.Duration) error
}

// backlogger is a Service that retries failed releases in the background;
// the metrics then report its backlog.
type backlogger interface{ Backlog() broker.Backlog }

// waiter is a Service whose allocate requests can wait for a slot; the
// metrics then report how many wait.
type waiter interface{ Waiting() int }

// liveReader is a Service that ranks on kept live state; the metrics then
// report how it was come by.
type liveReader interface{ LiveReads() broker.LiveReads }

// Admin is what the admin API and /readyz need.
type Admin interface {
	Put(ctx context.Context, k catalog.Key) (catalog.Key, error)
	Update(ctx context.Context, id string, p catalog.Patch) (catalog.Key, error)
	// PutMany writes every key to the catalog or none, then syncs them.
	PutMany(ctx context.Context, keys ...catalog.Key) ([]catalog.Key, error)
	Keys(ctx context.Context) ([]broker.KeyView, error)
	Key(ctx context.Context, id string) (broker.KeyView, error)
	Delete(ctx context.Context, id string) error
	ClearLeases(ctx context.Context, id string) (int, error)
	Sync(ctx context.Context) (int, error)
	SetAlias(ctx context.Context, provider, alias, model string) error
	DeleteAlias(ctx context.Context, provider, alias string) error
	Aliases(ctx context.Context) ([]catalog.Alias, error)
	Ready(ctx context.Context) error
	// Losses reports keys the lease store lost and that are held back.
	Losses(ctx context.Context) (broker.LossReport, error)
}

// MinKeyLen is the shortest internal or admin key New accepts.
const MinKeyLen = 16

// Config wires the API. Service, Admin, Metrics and the two keys are
// required; the rest have defaults.
type Config struct {
	Service Service
	Admin   Admin
	// InternalKey guards /api/internal (header X-Internal-Key), AdminKey
	// guards /api/admin (X-Admin-Key). They must differ and be at least
	// MinKeyLen characters: a short key is guessed.
	InternalKey string
	AdminKey    string
	// Store names the active lease store in /readyz ("redis", "sqlite").
	Store string
	// Nodes, if set, reports the lease store's servers as last checked,
	// writes included (each master of a Redis Cluster; the SQLite file):
	// /readyz says "degraded" while some cannot grant and others can,
	// "unavailable" while none can, and the metrics export each.
	//
	// default: nil (nothing checked)
	Nodes   func() []optimistic.NodeHealth
	Metrics *Metrics
	// RequestTimeout bounds each request's work, store retries included; a
	// request that runs out gets 503 "timeout".
	//
	// default: 10s
	RequestTimeout time.Duration
	// MaxLease bounds lease_seconds (whole seconds); give it the broker's
	// Options.MaxLease.
	//
	// default: broker.DefaultMaxLease (1h)
	MaxLease time.Duration
	// Logger gets one JSON line per request with key_id and lease_id when
	// known; never a secret.
	//
	// default: slog.Default()
	Logger *slog.Logger
	// LogDropped, if set, says how many of Logger's lines were dropped so
	// far, for the metrics (credpool_log_lines_dropped_total).
	LogDropped func() int64
}

// New returns the API's http.Handler.
func New(cfg Config) (http.Handler, error) {
	switch {
	case cfg.Service == nil || cfg.Admin == nil || cfg.Metrics == nil:
		return nil, errors.New("handlers: Service, Admin and Metrics are required")
	case len(cfg.InternalKey) < MinKeyLen || len(cfg.AdminKey) < MinKeyLen:
		return nil, fmt.Errorf("handlers: internal and admin keys are required, at least %d characters each", MinKeyLen)
	case cfg.InternalKey == cfg.AdminKey:
		return nil, errors.New("handlers: internal and admin keys must differ")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 10 * time.Second
	}
	if cfg.MaxLease < time.Second {
		cfg.MaxLease = broker.DefaultMaxLease
	}
	if b, ok := cfg.Service.(backlogger); ok {
		cfg.Metrics.watchBacklog(b.Backlog)
	}
	if w, ok := cfg.Service.(waiter); ok {
		cfg.Metrics.watchWaiting(w.Waiting)
	}
	if l, ok := cfg.Service.(liveReader); ok {
		cfg.Metrics.watchLiveReads(l.LiveReads)
	}
	cfg.Metrics.watchLosses(cfg.Admin.Losses)
	if cfg.Nodes != nil {
		cfg.Metrics.watchNodes(cfg.Nodes)
	}
	if cfg.LogDropped != nil {
		cfg.Metrics.watchLogDrops(cfg.LogDropped)
	}
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.HandleMethodNotAllowed = true
	// A path near a route is no route (404 as JSON), not a redirect to it.
	r.RedirectTrailingSlash = false
	// Routes match the path as sent, so that an escaped "/" (%2F) stays
	// inside its segment: aliases may hold one (org/model). gin would
	// unescape such a path's parameters as a query's, "+" as a space:
	// param unescapes them as a path's.
	r.UseRawPath = true
	r.UnescapePathValues = false
	r.Use(recovery(cfg.Logger), requestLog(cfg.Logger), deadline(cfg.RequestTimeout))
	r.NoRoute(func(c *gin.Context) { fail(c, http.StatusNotFound, "not_found", "no such endpoint", "") })
	r.NoMethod(func(c *gin.Context) {
		fail(c, http.StatusMethodNotAllowed, "method_not_allowed", "method not allowed", "")
	})

	r.GET("/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	r.GET("/readyz", func(c *gin.Context) {
		err := cfg.Admin.Ready(c.Request.Context())
		up, down, why := countNodes(cfg.Nodes)
		if err == nil && up == 0 && down > 0 {
			// It answers, but no server took the last check's write: no
			// grant can be made. why (%v) names the cause, not the answer:
			// a probe that ran out of its check's time is no timeout of
			// this request.
			err = fmt.Errorf("%w: no lease store server takes writes: %v", optimistic.ErrStore, why)
		}
		if err != nil {
			// Unauthenticated: say which part is down, not its addresses.
			cfg.Logger.WarnContext(c.Request.Context(), "not ready", "err", err)
			_, code := statusFor(err)
			c.JSON(http.StatusServiceUnavailable, gin.H{"status": "unavailable", "store": cfg.Store, "error": code})
			return
		}
		body := gin.H{"status": "ok", "store": cfg.Store}
		if l, err := cfg.Admin.Losses(c.Request.Context()); err == nil && l.Held > 0 {
			// Serving, but not all keys: say which part and until when.
			body["status"] = "degraded"
			body["store_lost_keys"] = gin.H{"held": l.Held, "until": l.Until.UTC()}
		}
		if down > 0 {
			// Serving the keys on the servers that answer; the metrics
			// name the others (this endpoint takes no key).
			body["status"] = "degraded"
			body["store_nodes"] = gin.H{"up": up, "down": down}
		}
		c.JSON(http.StatusOK, body)
	})
	r.GET("/metrics", gin.WrapH(cfg.Metrics.Handler()))
	r.GET("/openapi.yaml", serveOpenAPI)

	in := internalAPI{svc: cfg.Service, m: cfg.Metrics, maxLease: int(cfg.MaxLease / time.Second)}
	internal := r.Group("/api/internal", requireKey("X-Internal-Key", cfg.InternalKey))
	internal.POST("/allocate-key", in.allocate)
	internal.POST("/release", in.release)
	internal.POST("/renew", in.renew)
	internal.POST("/report", in.report)

	ad := adminAPI{admin: cfg.Admin}
	admin := r.Group("/api/admin", requireKey("X-Admin-Key", cfg.AdminKey))
	admin.GET("/keys", ad.list)
	admin.PUT("/keys", ad.putMany)
	admin.GET("/keys/:id", ad.get)
	admin.PUT("/keys/:id", ad.put)
	admin.PATCH("/keys/:id", ad.update)
	admin.DELETE("/keys/:id", ad.delete)
	admin.POST("/keys/:id/clear-leases", ad.clearLeases)
	admin.POST("/sync", ad.sync)
	admin.GET("/aliases", ad.aliases)
	admin.PUT("/aliases/:provider/:alias", ad.setAlias)
	admin.DELETE("/aliases/:provider/:alias", ad.deleteAlias)
	return r, nil
}

// countNodes counts the servers nodes reports taking writes and not, and
// says why the first of those not did not; none without nodes.
func countNodes(nodes func() []optimistic.NodeHealth) (up, down int, why error) {
	if nodes == nil {
		return 0, 0, nil
	}
	for _, n := range nodes() {
		if n.Err != nil {
			down++
			why = cmp.Or(why, n.Err)
		} else {
			up++
		}
	}
	return up, down, why
}
