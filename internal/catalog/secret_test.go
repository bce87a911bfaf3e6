package catalog_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/catalog"
)

// The secret must not leak through any way a Key is commonly printed,
// logged or marshalled.
func TestSecretNeverPrinted(t *testing.T) {
	c, _ := newCatalog(t)
	put(t, c, testKey("k1"))
	k := get(t, c, "k1")
	keys, err := c.List(t.Context(), "", "")
	require.NoError(t, err)

	var outputs []string
	for _, v := range []any{k, &k, keys, k.Secret} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
			outputs = append(outputs, fmt.Sprintf(verb, v))
		}
		b, err := json.Marshal(v)
		require.NoError(t, err)
		outputs = append(outputs, string(b))
	}
	for _, h := range []func(*bytes.Buffer) slog.Handler{
		func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
		func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
	} {
		var buf bytes.Buffer
		log := slog.New(h(&buf))
		log.Info("key", "key", k, "ptr", &k, "keys", keys, "secret", k.Secret)
		log.Info("key", slog.Any("key", k), slog.Group("g", "secret", k.Secret))
		outputs = append(outputs, buf.String())
	}

	for _, out := range outputs {
		require.NotContains(t, out, secret)
		require.NotContains(t, out, fmt.Sprintf("%x", secret))
	}
	require.Contains(t, fmt.Sprint(k), "[redacted]")
	require.Equal(t, secret, k.Secret.Reveal())
	require.IsType(t, catalog.Secret(""), k.Secret)
}
