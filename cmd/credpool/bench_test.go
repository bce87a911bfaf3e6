package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The suite's defaults are make bench's: the Redis stores with and without
// the gate, three runs of each cell, two pauses.
func TestBenchSuiteFlags(t *testing.T) {
	b, err := parseBench(nil)
	require.NoError(t, err)
	c := b.suite
	require.Equal(t, 4, c.Reps, "even: each order runs first equally often in every cell")
	var names []string
	for _, s := range c.Strategies {
		names = append(names, s.Name)
	}
	require.Equal(t, []string{"optimistic", "optimistic-nogate", "lua", "lua+gate"}, names)
	require.Len(t, c.Cells, 32)

	b, err = parseBench([]string{"-scenarios", "hot", "-limits", "1", "-procs", "1", "-pause", "2ms, 10ms", "-reps", "5"})
	require.NoError(t, err)
	require.Equal(t, 5, b.suite.Reps)
	require.Len(t, b.suite.Cells, 2)
	require.Equal(t, 2*time.Millisecond, b.suite.Cells[0].Spec.Pause)
	require.Equal(t, 10*time.Millisecond, b.suite.Cells[1].Spec.Pause)

	require.Zero(t, b.suite.Cells[0].Spec.Wait, "callers retry by default")

	b, err = parseBench([]string{"-scenarios", "hot", "-limits", "1", "-procs", "1", "-pause", "1ms,5ms", "-callers", "retry, wait"})
	require.NoError(t, err)
	require.Len(t, b.suite.Cells, 3, "two pauses of retrying callers, one cell of waiting ones")
	require.Equal(t, 10*time.Second, b.suite.Cells[2].Spec.Wait)
	b, err = parseBench([]string{"-scenarios", "hot", "-limits", "1", "-procs", "1", "-callers", "wait", "-wait", "2s"})
	require.NoError(t, err)
	require.Len(t, b.suite.Cells, 1)
	require.Equal(t, 2*time.Second, b.suite.Cells[0].Spec.Wait)
	for _, bad := range [][]string{
		{"-callers", "queue"},
		{"-callers", "wait,wait"},
		{"-callers", ""},
		{"-callers", "wait", "-wait", "0s"},
		{"-service", "-callers", "wait"},
	} {
		_, err = parseBench(bad)
		require.Error(t, err, "%q", bad)
	}

	b, err = parseBench([]string{"-service", "-pause", "3ms", "-reps", "2"})
	require.NoError(t, err)
	require.Equal(t, 3*time.Millisecond, b.svc.Pause)
	require.Equal(t, 2, b.svc.Reps)
}
