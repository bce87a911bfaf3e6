package server

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/broker"
	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/internal/sqlitex/sqlitextest"
)

// A pool fallback that is not one-way is refused whoever configures it,
// not only by serve's flag.
func TestNewRefusesAFallbackCycle(t *testing.T) {
	sealer, err := catalog.NewSealer(bytes.Repeat([]byte{7}, 32))
	require.NoError(t, err)
	_, err = New(t.Context(), Config{
		DB: sqlitextest.Temp(t), Sealer: sealer,
		Pools: broker.PoolOrder{"vip": {"default"}, "default": {"vip"}},
	})
	require.ErrorContains(t, err, "one-way")
}
