package redisproc

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// A missing redis-server, or a REDIS_SERVER that names no executable, is
// refused before anything is started, with the hint on how to get one.
func TestBinaryNotFound(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "redis-server.txt")
	require.NoError(t, os.WriteFile(notExec, []byte("not a program"), 0o644))
	tests := []struct {
		name, env, path string
	}{
		{"none on an empty PATH", "", ""},
		{"missing file", filepath.Join(dir, "no-such-redis-server"), os.Getenv("PATH")},
		{"a directory", dir, os.Getenv("PATH")},
		{"not executable", notExec, os.Getenv("PATH")},
		{"name not on PATH", "no-such-redis-server", os.Getenv("PATH")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("REDIS_SERVER", tt.env)
			t.Setenv("PATH", tt.path)
			_, err := Binary()
			require.ErrorContains(t, err, InstallHint)
			if tt.env != "" {
				require.ErrorContains(t, err, "REDIS_SERVER="+tt.env)
			}
			_, err = Run(t.TempDir(), false)
			require.ErrorContains(t, err, InstallHint, "Run fails the same way, starting nothing")
		})
	}
}

// REDIS_SERVER may be a path or a name on PATH.
func TestBinaryFromEnv(t *testing.T) {
	bin, err := Binary()
	require.NoError(t, err, "the tests need a redis-server")
	t.Setenv("REDIS_SERVER", bin)
	got, err := Binary()
	require.NoError(t, err)
	require.Equal(t, bin, got)

	t.Setenv("REDIS_SERVER", filepath.Base(bin))
	t.Setenv("PATH", filepath.Dir(bin))
	got, err = Binary()
	require.NoError(t, err)
	require.Equal(t, bin, got)
}

// A server already answering on the port is not taken for the one just
// started: here a process that never listens, on the port of a real
// server.
func TestLaunchRejectsAnotherServer(t *testing.T) {
	bin, err := Binary()
	require.NoError(t, err, "the tests need a redis-server")
	real, err := Run(t.TempDir(), false)
	require.NoError(t, err)
	t.Cleanup(real.Stop)

	fake := filepath.Join(t.TempDir(), "fake-redis-server")
	require.NoError(t, os.WriteFile(fake, []byte("#!/bin/sh\nexec sleep 60\n"), 0o755))
	s, err := launch(fake, t.TempDir(), real.port, false, nil)
	if s != nil {
		s.Stop()
	}
	require.ErrorContains(t, err, "answered by another redis-server")

	own, err := launch(bin, t.TempDir(), real.port, false, nil)
	if own != nil {
		own.Stop()
	}
	require.Error(t, err, "a real one cannot bind the taken port either")
}

// A cluster node's port may be any the kernel hands out, above 55535 too,
// where the default bus port (port+10000) is past 65535: the node gets a
// free bus port of its own.
func TestClusterNodeOnAHighPort(t *testing.T) {
	bin, err := Binary()
	require.NoError(t, err)
	port := 0
	for p := 55536; p < 61000 && port == 0; p += 97 {
		if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p))); err == nil {
			require.NoError(t, l.Close())
			port = p
		}
	}
	require.NotZero(t, port, "no free port above 55535")
	args, err := withBusPort(nil)
	require.NoError(t, err)
	s, err := launch(bin, t.TempDir(), port, true, args)
	require.NoError(t, err)
	s.Stop()
}
