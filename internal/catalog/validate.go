package catalog

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/credpool/credpool/optimistic"
)

// maxModelLen bounds model ids and aliases. They are looser than key ids
// (providers use "/", ":" and "@"), but never blank or padded.
const maxModelLen = 256

// validate returns an optimistic.ErrInvalid naming the first bad field of k.
// It never quotes the secret.
func validate(k Key) error {
	if err := k.LeaseState().Validate(); err != nil {
		return err
	}
	if len(k.Models) == 0 {
		return invalidf("models of key %s: want at least one", k.ID)
	}
	for _, m := range k.Models {
		if err := CheckModel("model", m); err != nil {
			return fmt.Errorf("%w (key %s)", err, k.ID)
		}
	}
	if strings.TrimSpace(string(k.Secret)) == "" {
		return invalidf("secret of key %s: want non-blank", k.ID)
	}
	if k.MaxConcurrentUses < 1 {
		return invalidf("max_concurrent_uses %d of key %s: want at least 1", k.MaxConcurrentUses, k.ID)
	}
	for _, c := range []struct {
		name string
		n    int64
	}{{"successes", k.Successes}, {"errors", k.Errors}, {"rate_limit_hits", k.RateLimitHits}} {
		if c.n < 0 {
			return invalidf("%s %d of key %s: want at least 0", c.name, c.n, k.ID)
		}
	}
	return nil
}

// CheckModel returns an optimistic.ErrInvalid naming field unless s is
// 1..maxModelLen bytes without spaces or control characters: the rule for
// model ids and aliases wherever one is accepted.
func CheckModel(field, s string) error {
	ok := s != "" && len(s) <= maxModelLen
	for _, r := range s {
		// A comma means a list pasted as one name (a,b): no model has one.
		if unicode.IsSpace(r) || unicode.IsControl(r) || r == unicode.ReplacementChar || r == ',' {
			ok = false
		}
	}
	if !ok {
		return invalidf("%s: want 1-%d characters, no spaces, commas or control characters", field, maxModelLen)
	}
	return nil
}

// invalidf returns an optimistic.ErrInvalid: the catalog and the lease
// stores share it, so a handler maps bad input to 400 in one place.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", optimistic.ErrInvalid, fmt.Sprintf(format, args...))
}
