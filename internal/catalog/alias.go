package catalog

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/credpool/credpool/optimistic"
)

// ErrAliasNotFound means the provider has no such alias.
var ErrAliasNotFound = errors.New("catalog: alias not found")

// Alias is one model alias: requests of Provider for Name get keys serving
// Model.
type Alias struct {
	Provider, Name, Model string
}

// SetAlias makes alias name model for provider's keys, replacing any
// earlier target. Resolution is one step: model is not itself resolved.
// An alias comes before a model of the same name: keys serving a model
// named like an alias are not reached by that name while the alias stands.
func (s *SQL) SetAlias(ctx context.Context, provider, alias, model string) error {
	if err := checkAlias(provider, alias); err != nil {
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

// DeleteAlias removes provider's alias: requests for it then get keys
// serving a model of that name. ErrAliasNotFound if there is none.
func (s *SQL) DeleteAlias(ctx context.Context, provider, alias string) error {
	if err := checkAlias(provider, alias); err != nil {
		return err
	}
	return s.write(ctx, fmt.Sprintf("delete alias %q of %s", alias, provider), func(tx txn, _ int64) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM catalog_model_aliases WHERE provider = ? AND alias = ?`, provider, alias)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err == nil && n == 0 {
			err = fmt.Errorf("%w: %q of %s", ErrAliasNotFound, alias, provider)
		}
		return err
	})
}

// Aliases returns every alias, by provider then name.
func (s *SQL) Aliases(ctx context.Context) ([]Alias, error) {
	var all map[alias]string
	err := s.db.readTx(ctx, func(tx txn) error {
		var err error
		all, err = aliases(ctx, tx)
		return err
	})
	if err != nil {
		return nil, fail(ctx, "list aliases", err)
	}
	out := make([]Alias, 0, len(all))
	for a, model := range all {
		out = append(out, Alias{Provider: a.provider, Name: a.name, Model: model})
	}
	slices.SortFunc(out, func(a, b Alias) int {
		return cmp.Or(cmp.Compare(a.Provider, b.Provider), cmp.Compare(a.Name, b.Name))
	})
	return out, nil
}

func checkAlias(provider, alias string) error {
	if !optimistic.ValidID(provider) {
		return invalidf("provider: want 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit")
	}
	return CheckModel("alias", alias)
}
