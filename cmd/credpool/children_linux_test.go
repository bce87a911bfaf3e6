package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// livingChildren lists this process's child processes that still run
// (zombies of other tests' killed processes are not running), from /proc.
func livingChildren(t *testing.T) []int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	require.NoError(t, err)
	var pids []int
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // exited meanwhile
		}
		// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
		fields := bytes.Fields(b[bytes.LastIndexByte(b, ')')+1:])
		if len(fields) < 2 || string(fields[0]) == "Z" || string(fields[1]) != strconv.Itoa(os.Getpid()) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		require.NoError(t, err)
		pids = append(pids, pid)
	}
	return pids
}
