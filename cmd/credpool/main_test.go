package main

import (
	"os"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTuneGC(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })

	t.Setenv("GOGC", "")
	tuneGC()
	require.Equal(t, gcPercent, debug.SetGCPercent(100), "GOGC empty: credpool's default")

	require.NoError(t, os.Unsetenv("GOGC"))
	tuneGC()
	require.Equal(t, gcPercent, debug.SetGCPercent(100), "GOGC unset: credpool's default")

	t.Setenv("GOGC", "50")
	tuneGC()
	require.Equal(t, 100, debug.SetGCPercent(100), "GOGC set: tuneGC leaves the collector as it was")
}
