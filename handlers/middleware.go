package handlers

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
)

// requireKey rejects requests whose header does not carry want. Both sides
// are hashed first so the comparison takes the same time whatever the
// length or content of the guess.
func requireKey(header, want string) gin.HandlerFunc {
	wantSum := sha256.Sum256([]byte(want))
	return func(c *gin.Context) {
		got := sha256.Sum256([]byte(c.GetHeader(header)))
		if subtle.ConstantTimeCompare(got[:], wantSum[:]) != 1 {
			fail(c, http.StatusUnauthorized, "unauthorized", "missing or wrong "+header, "")
			c.Abort()
			return
		}
		c.Next()
	}
}

// Context keys under which handlers leave ids, and the error behind a
// server fault, for the request log.
const (
	logKeyID   = "key_id"
	logLeaseID = "lease_id"
	logError   = "error"
)

// requestLog writes one line per request: method, path, status, duration,
// and the key and lease ids the handler recorded. Bodies and headers are
// never logged: they carry keys and credentials.
func requestLog(log *slog.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		c.Next()
		attrs := []any{
			"method", c.Request.Method, "path", c.FullPath(), "status", c.Writer.Status(),
			"duration_ms", float64(time.Since(start).Microseconds()) / 1000,
		}
		if c.FullPath() == "" {
			attrs[3] = c.Request.URL.Path
		}
		for _, k := range []string{logKeyID, logLeaseID, logError} {
			if v := c.GetString(k); v != "" {
				attrs = append(attrs, k, v)
			}
		}
		if code := c.GetString("error_code"); code != "" {
			attrs = append(attrs, "error_code", code)
		}
		log.InfoContext(c.Request.Context(), "request", attrs...)
	}
}

// deadline gives each request a context that ends after d.
func deadline(d time.Duration) gin.HandlerFunc {
	return func(c *gin.Context) {
		ctx, cancel := context.WithTimeout(c.Request.Context(), d)
		defer cancel()
		c.Request = c.Request.WithContext(ctx)
		c.Next()
	}
}

// recovery turns a panic into a 500 without echoing it to the client.
func recovery(log *slog.Logger) gin.HandlerFunc {
	return gin.CustomRecoveryWithWriter(nil, func(c *gin.Context, err any) {
		log.ErrorContext(c.Request.Context(), "panic", "path", c.Request.URL.Path, "panic", err)
		fail(c, http.StatusInternalServerError, "internal", "internal error", "")
		c.Abort()
	})
}
