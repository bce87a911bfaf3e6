package catalog_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/optimistic"
)

func TestAliases(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, nil)
		cc := newCache(t, c, nil)
		resolve := func(provider, model string) string {
			t.Helper()
			got, err := cc.ResolveModel(t.Context(), provider, model)
			require.NoError(t, err)
			return got
		}

		require.Equal(t, "gpt-4o", resolve("openai", "gpt-4o"), "no alias: the model itself")

		require.NoError(t, c.SetAlias(t.Context(), "openai", "gpt-4o", "gpt-4o-2024-05-13"))
		require.NoError(t, c.SetAlias(t.Context(), "openai", "gpt-4o", "gpt-4o-2024-08-06"))
		require.NoError(t, c.SetAlias(t.Context(), "openai", "gpt-4o-2024-08-06", "gpt-4o-next"))
		require.NoError(t, c.SetAlias(t.Context(), "azure", "gpt-4o", "gpt-4o-eu"))

		require.Equal(t, "gpt-4o-2024-08-06", resolve("openai", "gpt-4o"), "replaced, and one step only")
		require.Equal(t, "gpt-4o-eu", resolve("azure", "gpt-4o"), "per provider")
		require.Equal(t, "gpt-4o", resolve("anthropic", "gpt-4o"))

		tests := []struct {
			provider, alias, model, field string
		}{
			{"open ai", "gpt-4o", "gpt-4o-2024-08-06", "provider"},
			{"openai", "", "gpt-4o-2024-08-06", "alias"},
			{"openai", "gpt 4o", "gpt-4o-2024-08-06", "alias"},
			{"openai", "gpt-4o", "", "model"},
		}
		for _, tt := range tests {
			err := c.SetAlias(t.Context(), tt.provider, tt.alias, tt.model)
			require.ErrorIs(t, err, optimistic.ErrInvalid)
			require.Contains(t, err.Error(), tt.field)
		}
	})
}
