package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/optimistic"
)

// TestMain lets the test binary stand in for credpool: with
// CREDPOOL_TEST_MAIN=1 it runs main with the given arguments.
func TestMain(m *testing.M) {
	if os.Getenv("CREDPOOL_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestParseWeights(t *testing.T) {
	w, err := parseWeights("capacity=2, jitter=0 ,rate_limit=0.7")
	require.NoError(t, err)
	want := optimistic.DefaultWeights
	want.Capacity, want.Jitter, want.RateLimit = 2, 0, 0.7
	require.Equal(t, want, w)
	for _, bad := range []string{"capacity", "speed=1", "idle=-1", "idle=x"} {
		_, err := parseWeights(bad)
		require.Error(t, err, bad)
	}
}

func TestParsePoolOrder(t *testing.T) {
	o, err := parsePoolOrder("vip=default; gold=silver+default")
	require.NoError(t, err)
	require.Equal(t, optimistic.PoolOrder{"vip": {"default"}, "gold": {"silver", "default"}}, o)
	for _, bad := range []string{"vip", "vip=", "a/b=default", "vip=de fault"} {
		_, err := parsePoolOrder(bad)
		require.Error(t, err, bad)
	}
}

func TestServeRefusesWithoutKeys(t *testing.T) {
	t.Setenv("CREDPOOL_INTERNAL_KEY", "")
	t.Setenv("CREDPOOL_ADMIN_KEY", "")
	err := serve([]string{"--db", filepath.Join(t.TempDir(), "x.db")})
	require.ErrorContains(t, err, "no internal key")
	err = serve([]string{"--db", filepath.Join(t.TempDir(), "x.db"), "--internal-key", "same", "--admin-key", "same"})
	require.ErrorContains(t, err, "must differ")
}

// TestServeDemo runs "credpool serve --dev --demo" as a process on the
// SQLite store, allocates over HTTP, and stops it with SIGTERM.
func TestServeDemo(t *testing.T) {
	cmd := exec.Command(os.Args[0], "serve", "--dev", "--demo", "--listen", "127.0.0.1:0",
		"--db", filepath.Join(t.TempDir(), "demo.db"))
	cmd.Env = append(os.Environ(), "CREDPOOL_TEST_MAIN=1", "CREDPOOL_REDIS_URL=", "CREDPOOL_INTERNAL_KEY=", "CREDPOOL_ADMIN_KEY=")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	var internal, addr, store string
	lines := bufio.NewScanner(stderr)
	var seen []string
	for addr == "" && lines.Scan() {
		line := lines.Text()
		seen = append(seen, line)
		if k, ok := strings.CutPrefix(line, "dev mode: generated internal key: "); ok {
			internal = k
		}
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "credpool serving" {
			addr, _ = rec["addr"].(string)
			store, _ = rec["lease_store"].(string)
		}
	}
	require.NotEmpty(t, addr, "no serving line in:\n%s", strings.Join(seen, "\n"))
	require.NotEmpty(t, internal)
	require.Equal(t, "sqlite", store)
	go func() { _, _ = io.Copy(io.Discard, stderr) }()

	body := `{"provider":"openai","model":"gpt-4o","pool":"vip"}`
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/api/internal/allocate-key", bytes.NewBufferString(body))
	req.Header.Set("X-Internal-Key", internal)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var grant map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&grant))
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%v", grant)
	require.Equal(t, "demo-vip-1", grant["key_id"])
	require.Equal(t, "gpt-4o-2024-08-06", grant["provider_model"])

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "graceful exit after SIGTERM")
	case <-time.After(20 * time.Second):
		t.Fatal("credpool did not exit after SIGTERM")
	}
}
