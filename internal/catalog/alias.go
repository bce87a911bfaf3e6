package catalog

import (
	"context"
	"fmt"

	"github.com/credpool/credpool/optimistic"
)

// SetAlias makes alias name model for provider's keys, replacing any
// earlier target. Resolution is one step: model is not itself resolved.
func (s *SQL) SetAlias(ctx context.Context, provider, alias, model string) error {
	if !optimistic.ValidID(provider) {
		return invalidf("provider: want 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit")
	}
	if err := CheckModel("alias", alias); err != nil {
		return err
	}
	if err := CheckModel("model", model); err != nil {
		return err
	}
	// No key row changes: a Cache reloads every alias when the generation
	// moves.
	return s.write(ctx, fmt.Sprintf("set alias %q of %s", alias, provider), func(tx txn, _ int64) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO catalog_model_aliases (provider, alias, model) VALUES (?, ?, ?)
		ON CONFLICT (provider, alias) DO UPDATE SET model = excluded.model`, provider, alias, model)
		return err
	})
}
