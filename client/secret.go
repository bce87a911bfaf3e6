package client

import (
	"fmt"
	"io"
	"log/slog"
)

// redacted replaces a secret wherever it would be printed.
const redacted = "[redacted]"

// Secret is a credential's secret. It prints, logs and marshals as
// "[redacted]"; Reveal is the one way to read it.
type Secret string

// Format covers every fmt verb: without it a verb that does not fit a
// string (%d) makes fmt print the raw value.
func (Secret) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, redacted) }

// String redacts the secret (fmt's %s and %v).
func (Secret) String() string { return redacted }

// GoString redacts the secret (fmt's %#v).
func (Secret) GoString() string { return redacted }

// LogValue redacts the secret in slog.
func (Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalJSON redacts the secret in JSON.
func (Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }

// MarshalText redacts the secret wherever text encoding is used.
func (Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// Reveal returns the secret itself: the one way to read it.
func (s Secret) Reveal() string { return string(s) }

// Credential is what a lease grants: the upstream secret. It prints, logs
// and marshals redacted, since its one field does.
type Credential struct {
	// APIKey is the upstream API key; APIKey.Reveal() reads it.
	APIKey Secret
}
