package handlers

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/require"
)

// A body that does not decode is answered in JSON's words, naming the
// field as the request spells it, and never quoting what it carried.
func TestDecodeAnswers(t *testing.T) {
	gin.SetMode(gin.TestMode)
	for _, c := range []struct {
		name, body    string
		bulk          bool
		code, message string
		field         string
	}{
		{"not JSON", `{"provider":`, false, "invalid_request", "body is not valid JSON", ""},
		{"not an object", `["sk-secret"]`, false, "invalid_request", "body: want a JSON object", ""},
		{"a string for a number", `{"lease_seconds":"sk-secret"}`, false, "invalid_request", "lease_seconds: want a JSON integer", "lease_seconds"},
		{"unknown field", `{"surprise":1}`, false, "invalid_request", "unknown field surprise", "surprise"},
		{"more after the object", `{"provider":"p"} {}`, false, "invalid_request", "body must hold one JSON object, and nothing after it", ""},
		{"a name in another case", `{"Provider":"sk-secret"}`, false, "invalid_request", "unknown field Provider", "Provider"},
		{"a name twice", `{"model":"m","model":"sk-secret"}`, false, "invalid_request", "field model given twice", "model"},
		{"a bulk item's name twice", `[{"id":"k","id":"j"}]`, true, "invalid_request", "field [0].id given twice", "[0].id"},
		{"a bulk item's embedded field in another case", `[{"id":"k","MAX_CONCURRENT_USES":1}]`, true, "invalid_request", "unknown field [0].MAX_CONCURRENT_USES", "[0].MAX_CONCURRENT_USES"},
		{"a bulk item's embedded field", `[{"id":"k"},{"id":"j","max_concurrent_uses":"sk-secret"}]`, true, "invalid_request", "[1].max_concurrent_uses: want a JSON integer", "[1].max_concurrent_uses"},
		{"a bulk item's unknown field", `[{"id":"k","surprise":1}]`, true, "invalid_request", "unknown field [0].surprise", "[0].surprise"},
		{"a bulk item not an object", `[{"id":"k"},"sk-secret"]`, true, "invalid_request", "[1]: want a JSON object", "[1]"},
		{"an object for a bulk body", `{"id":"k"}`, true, "invalid_request", "body: want a JSON array", ""},
		{"a bulk item's time not RFC 3339", `[{"id":"k","cooldown_until":null},{"id":"j","cooldown_until":"sk-secret"}]`, true, "invalid_request", "[1].cooldown_until: want RFC 3339, e.g. 2026-11-30T12:00:00Z", "[1].cooldown_until"},
		{"a bulk item's time a number", `[{"id":"k","last_verified_at":1764504000}]`, true, "invalid_request", "[0].last_verified_at: want RFC 3339, e.g. 2026-11-30T12:00:00Z", "[0].last_verified_at"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			ctx, _ := gin.CreateTestContext(w)
			ctx.Request = httptest.NewRequest(http.MethodPost, "/", strings.NewReader(c.body))
			var ok bool
			if c.bulk {
				_, ok = decodeItems[putKeysItem](ctx, maxBulkBody)
			} else {
				var dst allocateRequest
				ok = decode(ctx, &dst)
			}
			require.False(t, ok)
			require.Equal(t, http.StatusBadRequest, w.Code)
			require.NotContains(t, w.Body.String(), "sk-secret")
			var out struct {
				Error struct{ Code, Message, Field string }
			}
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &out))
			require.Equal(t, c.code, out.Error.Code)
			require.Equal(t, c.message, out.Error.Message)
			require.Equal(t, c.field, out.Error.Field)
		})
	}
}

// A body over the limit is 413, whatever fills it: white space after the
// object too.
func TestDecodeRefusesABodyOverTheLimit(t *testing.T) {
	gin.SetMode(gin.TestMode)
	w := httptest.NewRecorder()
	ctx, _ := gin.CreateTestContext(w)
	body := `{"provider":"openai","model":"m"}` + strings.Repeat(" ", maxBody)
	ctx.Request = httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
	var dst allocateRequest
	require.False(t, decode(ctx, &dst))
	require.Equal(t, http.StatusRequestEntityTooLarge, w.Code, w.Body.String())
}

// Every name the request types spell is taken as spelled, embedded
// structs' included.
func TestDecodeTakesEveryFieldName(t *testing.T) {
	gin.SetMode(gin.TestMode)
	w := httptest.NewRecorder()
	ctx, _ := gin.CreateTestContext(w)
	ctx.Request = httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`[{"id":"k","max_concurrent_uses":2,"provider":"openai"}]`))
	items, ok := decodeItems[putKeysItem](ctx, maxBulkBody)
	require.True(t, ok, w.Body.String())
	require.Equal(t, "k", items[0].ID)
	require.Equal(t, 2, *items[0].MaxConcurrentUses)
}
