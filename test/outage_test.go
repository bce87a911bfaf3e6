package test

import (
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// waitFor polls cond, bounded, for an effect the service brings about in
// the background.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still not %s after %s", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// storeOutage runs the same story on a store that fails and comes back:
// a held slot's release meets the outage (503, kept for retrying); an
// allocate on the now-full key is the store's fault (503), never "full"
// (429); once the store is back the slot returns by itself, in seconds,
// not at the lease's expiry.
func storeOutage(t *testing.T, s *service, fail, recover func()) {
	s.putKey(t, "k", "default", 1, nil)
	code, _, g := s.internal(t, "allocate-key", withField(allocBody("default"), "lease_seconds", 3600))
	require.Equal(t, http.StatusOK, code, "%v", g)

	fail()
	code, _, out := s.internal(t, "release", leaseBody(g))
	require.Equal(t, http.StatusServiceUnavailable, code, "%v", out)
	require.Equal(t, "store_unavailable", errCode(out))
	for range 3 {
		code, _, out = s.internal(t, "allocate-key", allocBody("default"))
		require.NotEqual(t, http.StatusTooManyRequests, code, "a broken store answered 429: %v", out)
		require.Equal(t, http.StatusServiceUnavailable, code, "%v", out)
	}
	recover()
	waitFor(t, "granted again after the store came back", 20*time.Second, func() bool {
		code, _, _ := s.internal(t, "allocate-key", allocBody("default"))
		return code == http.StatusOK
	})
}

// Redis unreachable (the network to it cut, its data intact).
func TestHTTPRedisOutageGivesSlotsBack(t *testing.T) {
	s := startService(t, serviceOptions{proxied: true})
	storeOutage(t, s, func() { s.proxy.SetDown(true) }, func() { s.proxy.SetDown(false) })
}

// The SQLite file's disk full: releases cannot write, while an allocate on
// a full key would write nothing and answer "no slot".
func TestHTTPDiskFullGivesSlotsBack(t *testing.T) {
	dir := smallTmpfs(t, "4m")
	s := startService(t, serviceOptions{sqlite: true, dir: dir})
	filler := filepath.Join(dir, "filler")
	storeOutage(t, s, func() { fillDisk(t, filler) }, func() { require.NoError(t, os.Remove(filler)) })
}

// smallTmpfs mounts a tmpfs of the given size on a fresh directory for the
// test: a disk that can really fill up. Mounting needs root (as CI runs).
func smallTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", dir).CombinedOutput()
	require.NoError(t, err, "the disk-full test mounts a small tmpfs, which needs root (CI runs as root): %s", out)
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fillDisk writes path until its file system has no space left.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			require.True(t, errors.Is(err, syscall.ENOSPC), "filling the disk: %v", err)
			return
		}
	}
}
