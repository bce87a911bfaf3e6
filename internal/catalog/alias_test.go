package catalog_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/catalog"
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

func TestAliasesListAndDelete(t *testing.T) {
	engines(t, func(t *testing.T, db database) {
		c := db.open(t, nil)
		cc := newCache(t, c, nil)
		list := func() []catalog.Alias {
			t.Helper()
			got, err := c.Aliases(t.Context())
			require.NoError(t, err)
			return got
		}
		require.Empty(t, list())

		require.NoError(t, c.SetAlias(t.Context(), "openai", "gpt-4o", "gpt-4o-2024-08-06"))
		require.NoError(t, c.SetAlias(t.Context(), "azure", "gpt-4o", "gpt-4o-eu"))
		require.NoError(t, c.SetAlias(t.Context(), "openai", "fast", "gpt-4o-mini"))
		require.Equal(t, []catalog.Alias{
			{Provider: "azure", Name: "gpt-4o", Model: "gpt-4o-eu"},
			{Provider: "openai", Name: "fast", Model: "gpt-4o-mini"},
			{Provider: "openai", Name: "gpt-4o", Model: "gpt-4o-2024-08-06"},
		}, list(), "by provider, then name")

		got, err := cc.ResolveModel(t.Context(), "openai", "gpt-4o")
		require.NoError(t, err)
		require.Equal(t, "gpt-4o-2024-08-06", got)

		require.NoError(t, c.DeleteAlias(t.Context(), "openai", "gpt-4o"))
		got, err = cc.ResolveModel(t.Context(), "openai", "gpt-4o")
		require.NoError(t, err)
		require.Equal(t, "gpt-4o", got, "the name is a model again, on the cache too")
		require.Equal(t, []catalog.Alias{
			{Provider: "azure", Name: "gpt-4o", Model: "gpt-4o-eu"},
			{Provider: "openai", Name: "fast", Model: "gpt-4o-mini"},
		}, list(), "only that provider's alias went")

		err = c.DeleteAlias(t.Context(), "openai", "gpt-4o")
		require.ErrorIs(t, err, catalog.ErrAliasNotFound)
		require.NotErrorIs(t, err, catalog.ErrNotFound, "not a key's 404")
		require.ErrorIs(t, c.DeleteAlias(t.Context(), "anthropic", "fast"), catalog.ErrAliasNotFound)

		err = c.DeleteAlias(t.Context(), "open ai", "fast")
		require.ErrorIs(t, err, optimistic.ErrInvalid)
		require.Contains(t, err.Error(), "provider")
		err = c.DeleteAlias(t.Context(), "openai", "fa st")
		require.ErrorIs(t, err, optimistic.ErrInvalid)
		require.Contains(t, err.Error(), "alias")
	})
}
