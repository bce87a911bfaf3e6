package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/client"
	"github.com/credpool/credpool/test/openapitest"
	"github.com/credpool/credpool/test/redistest"
)

// adminCLI runs admin commands against one credpool serve process, its
// URL and admin key in the environment as an operator would set them.
// Every exchange, the commands' and the test's own, is checked against
// the OpenAPI document.
type adminCLI struct {
	t    *testing.T
	env  map[string]string
	adm  *client.Admin
	http *http.Client
	// bulkPuts counts the commands' PUT /api/admin/keys requests.
	bulkPuts atomic.Int32
}

// roundTripFunc is a RoundTripper of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// startAdmin runs "credpool serve --dev --demo" (what make run starts),
// with known keys.
func startAdmin(t *testing.T) *adminCLI {
	t.Helper()
	db := filepath.Join(t.TempDir(), "credpool.db")
	// What the tests check is what an import does, not how fast: a
	// minute's budget keeps a loaded machine (the race detector, the other
	// tests) from failing a 1,000-key import.
	p := startServe(t, []string{"CREDPOOL_INTERNAL_KEY=" + internalK, "CREDPOOL_ADMIN_KEY=" + adminK}, "--dev", "--demo", "--db", db, "--request-timeout", "1m")
	url := "http://" + p.addr
	adm, err := client.NewAdmin(url, adminK, &client.Options{HTTPClient: openapitest.Client(nil)})
	require.NoError(t, err)
	a := &adminCLI{t: t, env: map[string]string{"CREDPOOL_URL": url, "CREDPOOL_ADMIN_KEY": adminK}, adm: adm}
	checked := openapitest.Transport(nil)
	a.http = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Method == http.MethodPut && r.URL.Path == "/api/admin/keys" {
			a.bulkPuts.Add(1)
		}
		return checked.RoundTrip(r)
	})}
	return a
}

// run runs "credpool args..." with stdin; it returns standard output,
// standard error and the error.
func (a *adminCLI) run(stdin string, args ...string) (string, string, error) {
	a.t.Helper()
	var out, errOut bytes.Buffer
	c := cli{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut, getenv: func(k string) string { return a.env[k] }, http: a.http}
	err := c.run(args[0], args[1:])
	return out.String(), errOut.String(), err
}

// keys lists the service's keys by id, through the client.
func (a *adminCLI) keys() map[string]client.Key {
	a.t.Helper()
	keys, err := a.adm.Keys(a.t.Context())
	require.NoError(a.t, err)
	out := map[string]client.Key{}
	for _, k := range keys {
		out[k.ID] = k
	}
	return out
}

// written is every key's last write, by id: what an import that writes
// nothing leaves as it was.
func (a *adminCLI) written() map[string]time.Time {
	a.t.Helper()
	out := map[string]time.Time{}
	for id, k := range a.keys() {
		require.NotNil(a.t, k.UpdatedAt)
		out[id] = *k.UpdatedAt
	}
	return out
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

// secretOf is the secret of the i-th generated key: what must never be
// printed.
func secretOf(i int) string { return fmt.Sprintf("sk-import-secret-%04d", i) }

func importCSV(n int) string {
	var b strings.Builder
	b.WriteString("id,provider,pool,models,secret,max_concurrent_uses\n")
	for i := range n {
		fmt.Fprintf(&b, "imp-%04d,openai,default,gpt-4o-2024-08-06 gpt-4o-mini,%s,%d\n", i, secretOf(i), 1+i%5)
	}
	return b.String()
}

// 1,000 keys from a CSV into a fresh service; the second run changes
// nothing and says so.
func TestKeysImportThousand(t *testing.T) {
	a := startAdmin(t)
	demo := len(a.keys())
	path := writeFile(t, "keys.csv", importCSV(1000))

	out, errOut, err := a.run("", "keys", "import", path)
	require.NoError(t, err, errOut)
	require.Equal(t, "1000 key(s) created, 0 updated, 0 unchanged\n", out)
	keys := a.keys()
	require.Len(t, keys, demo+1000)
	k := keys["imp-0007"]
	require.Equal(t, "openai", k.Provider)
	require.Equal(t, 3, k.MaxConcurrentUses)
	require.ElementsMatch(t, []string{"gpt-4o-2024-08-06", "gpt-4o-mini"}, k.Models)
	require.Equal(t, "available", k.Status)

	require.EqualValues(t, 1, a.bulkPuts.Load(), "1,000 keys in one request")

	out, errOut, err = a.run("", "keys", "import", path)
	require.NoError(t, err, errOut)
	require.Contains(t, out, "nothing to change: all 1000 key(s) already match")
	again := a.written()
	for id, k := range keys {
		require.Equal(t, *k.UpdatedAt, again[id], "%s was written again", id)
	}
	require.NotContains(t, out+errOut, "sk-import-secret")
	require.EqualValues(t, 1, a.bulkPuts.Load(), "nothing to write, no request")

	// Beyond 1,000 keys to write, batches of 1,000.
	out, errOut, err = a.run("", "keys", "import", writeFile(t, "more.csv", importCSV(2001)))
	require.NoError(t, err, errOut)
	require.Equal(t, "1001 key(s) created, 0 updated, 1000 unchanged\n", out)
	require.EqualValues(t, 3, a.bulkPuts.Load())
	require.Len(t, a.keys(), demo+2001)
}

// One bad row: nothing is written, and every problem is named by its line,
// without quoting the value.
func TestKeysImportBadRowWritesNothing(t *testing.T) {
	a := startAdmin(t)
	before := a.written()
	lines := strings.Split(strings.TrimSuffix(importCSV(5), "\n"), "\n")
	lines[3] = "imp-0002,openai,default,,sk-import-secret-0002,2" // line 4: no models
	path := writeFile(t, "keys.csv", strings.Join(lines, "\n")+"\n")
	out, errOut, err := a.run("", "keys", "import", path)
	require.ErrorContains(t, err, "nothing written")
	require.Equal(t, "line 4: models: want at least one\n", errOut)
	require.Empty(t, out)
	require.Equal(t, before, a.written(), "nothing written")

	// Several problems at once, each with its line; a value in the wrong
	// column is never echoed.
	bad := "id,provider,models,secret,max_concurrent_uses,status\n" +
		"ok-1,openai,m,s1,1,\n" +
		"bad id,openai,m,s2,1,\n" +
		"ok-1,openai,m,s3,x,\n" +
		"ok-3,sk-live-pasted-here!,m,,1,sleepy\n"
	_, errOut, err = a.run("", "keys", "import", writeFile(t, "bad.csv", bad))
	require.ErrorContains(t, err, "6 problem(s) in 4 row(s); nothing written")
	for _, want := range []string{
		"line 3: id: want", "line 4: max_concurrent_uses: want", "line 4: id: repeats line 2",
		"line 5: provider: want", "line 5: secret: required", "line 5: status: want",
	} {
		require.Contains(t, errOut, want)
	}
	require.NotContains(t, errOut, "sk-live-pasted-here")
	require.Equal(t, before, a.written())

	_, _, err = a.run("", "keys", "import", writeFile(t, "cols.csv", "id,provider,model,secret\n"))
	require.ErrorContains(t, err, "unknown column 3")

	// A row whose id starts with # is no comment: it is refused by its line.
	hashed := "id,provider,models,secret\nok-1,openai,m,s1\n#ok-2,openai,m,s2\n"
	_, errOut, err = a.run("", "keys", "import", writeFile(t, "hash.csv", hashed))
	require.ErrorContains(t, err, "nothing written")
	require.Equal(t, "line 3: id: want 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit\n", errOut)
	require.Equal(t, before, a.written())
}

// A header saved with a UTF-8 byte order mark (as spreadsheets do) reads
// as any other.
func TestKeysImportCSVWithBOM(t *testing.T) {
	a := startAdmin(t)
	out, errOut, err := a.run("", "keys", "import", writeFile(t, "bom.csv", "\ufeff"+importCSV(2)))
	require.NoError(t, err, errOut)
	require.Equal(t, "2 key(s) created, 0 updated, 0 unchanged\n", out)
	require.Contains(t, a.keys(), "imp-0001")
}

// A CSV models cell lists its models as --models does: at spaces or
// commas (a list with commas is a quoted cell). Never one model named
// "a,b", which no request would ever ask for.
func TestKeysImportCSVModelsWithCommas(t *testing.T) {
	a := startAdmin(t)
	csv := "id,provider,models,secret\nf2,openai,\"gpt-4o-2024-08-06,gpt-4o-mini\",sk-f2-xxxxxxxx\n"
	out, errOut, err := a.run("", "keys", "import", writeFile(t, "commas.csv", csv))
	require.NoError(t, err, errOut)
	require.Equal(t, "1 key(s) created, 0 updated, 0 unchanged\n", out)
	require.Equal(t, []string{"gpt-4o-2024-08-06", "gpt-4o-mini"}, a.keys()["f2"].Models)
}

// The service refusing the one request of an import (here a secret over
// its bound on the 30th row, which the command's own checks let through)
// writes nothing: not the rows before it either.
func TestKeysImportServiceFailureWritesNothing(t *testing.T) {
	a := startAdmin(t)
	before := a.written()
	lines := strings.Split(strings.TrimSuffix(importCSV(50), "\n"), "\n")
	lines[30] = "imp-0029,openai,default,gpt-4o-2024-08-06," + strings.Repeat("s", 5<<20) + ",1"
	out, errOut, err := a.run("", "keys", "import", writeFile(t, "big.csv", strings.Join(lines, "\n")+"\n"))
	require.ErrorIs(t, err, client.ErrInvalidRequest)
	require.ErrorContains(t, err, "nothing written")
	require.Empty(t, out, errOut)
	require.Equal(t, before, a.written(), "nothing written")
}

// JSON lines from standard input; a changed row is updated and keeps what
// it does not set (status), others are left alone.
func TestKeysImportJSONLines(t *testing.T) {
	a := startAdmin(t)
	rows := `{"id":"j1","provider":"openai","models":["gpt-4o-2024-08-06"],"secret":"sk-j1","max_concurrent_uses":2}
{"id":"j2","provider":"openai","pool":"vip","models":["gpt-4o-2024-08-06"],"secret":"sk-j2","status":"pending"}
`
	out, errOut, err := a.run(rows, "keys", "import", "-", "--format", "jsonl", "-o", "json")
	require.NoError(t, err, errOut)
	var plan importPlan
	require.NoError(t, json.Unmarshal([]byte(out), &plan))
	require.Equal(t, importPlan{Created: []string{"j1", "j2"}, Updated: []string{}}, plan)
	require.Equal(t, "pending", a.keys()["j2"].Status)
	require.Equal(t, "vip", a.keys()["j2"].Pool)

	_, err = a.adm.PutKey(t.Context(), "j1", client.KeySpec{
		Provider: "openai", Pool: "default", Models: []string{"gpt-4o-2024-08-06"}, Secret: "sk-j1",
		MaxConcurrentUses: 2, Status: "disabled",
	})
	require.NoError(t, err)
	changed := strings.Replace(rows, `"max_concurrent_uses":2`, `"max_concurrent_uses":4`, 1)
	out, errOut, err = a.run(changed, "keys", "import", "-", "--format", "jsonl", "--dry-run")
	require.NoError(t, err, errOut)
	require.Equal(t, "0 key(s) would be created, 1 would be updated, 1 unchanged\n", out)
	require.Equal(t, 2, a.keys()["j1"].MaxConcurrentUses, "a dry run writes nothing")
	out, errOut, err = a.run(changed, "keys", "import", "-", "--format", "jsonl")
	require.NoError(t, err, errOut)
	require.Equal(t, "0 key(s) created, 1 updated, 1 unchanged\n", out)
	j1 := a.keys()["j1"]
	require.Equal(t, 4, j1.MaxConcurrentUses)
	require.Equal(t, "disabled", j1.Status, "a row without a status keeps the key's")

	out, errOut, err = a.run(changed, "keys", "import", "-", "--format", "jsonl", "--update-secrets")
	require.NoError(t, err, errOut)
	require.Equal(t, "0 key(s) created, 2 updated, 0 unchanged\n", out)

	// A bad line names its field, never a value.
	for line, want := range map[string]string{
		`{"id":"j3","secret":"sk-oops","surprise":"sk-oops"}`:                   `line 2: unknown field "surprise"; want id, provider`,
		`{"id":"j3","provider":"openai","secret":"sk-oops","models":"sk-oops"}`: "line 2: field models: want an array of strings",
		`{"id":"j3","secret":"sk-oops","max_concurrent_uses":"sk-oops"}`:        "line 2: field max_concurrent_uses: want a number",
		`{"id":"j3","secret":12}`:                                               "line 2: field secret: want a string",
		`{"id":"j3","secret":"sk-oops"`:                                         "line 2: want one JSON object of id, provider",
	} {
		_, errOut, err = a.run("\n"+line+"\n", "keys", "import", "-", "--format", "jsonl")
		require.ErrorContains(t, err, want, line)
		require.NotContains(t, errOut+err.Error(), "sk-oops", line)
	}
}

// put reads the secret from standard input or a file, never from the
// command line, and no command prints it; the admin key comes from the
// environment or a file.
func TestKeysCommands(t *testing.T) {
	a := startAdmin(t)
	out, errOut, err := a.run("sk-put-secret\n", "keys", "put", "p1", "--provider", "openai", "--models", "gpt-4o-2024-08-06,gpt-4o-mini", "--limit", "3")
	require.NoError(t, err, errOut)
	require.Contains(t, out, "p1")
	require.Equal(t, 3, a.keys()["p1"].MaxConcurrentUses)

	secretFile := writeFile(t, "secret", "sk-file-secret\n")
	_, errOut, err = a.run("", "keys", "put", "p2", "--provider", "openai", "--models", "m", "--secret-file", secretFile, "--status", "pending")
	require.NoError(t, err, errOut)
	require.Equal(t, "pending", a.keys()["p2"].Status)
	_, _, err = a.run("", "keys", "put", "p3", "--provider", "openai", "--models", "m")
	require.ErrorContains(t, err, "the secret is empty")
	_, _, err = a.run("s", "keys", "put", "p3", "--provider", "openai", "--models", "m", "--limit", "0")
	require.ErrorContains(t, err, "max_concurrent_uses")
	require.NotContains(t, a.keys(), "p3")

	out, errOut, err = a.run("", "keys", "list")
	require.NoError(t, err, errOut)
	require.Contains(t, out, "ID")
	require.Contains(t, out, "p1")
	require.Contains(t, out, "demo-vip-1")
	out, _, err = a.run("", "keys", "get", "p1", "-o", "json")
	require.NoError(t, err)
	var k client.Key
	require.NoError(t, json.Unmarshal([]byte(out), &k))
	require.Equal(t, "p1", k.ID)
	out, _, err = a.run("", "keys", "list", "-o", "json")
	require.NoError(t, err)
	var keys []client.Key
	require.NoError(t, json.Unmarshal([]byte(out), &keys))
	require.Len(t, keys, len(a.keys()))

	// Disabled without its secret; the flags not given are kept.
	out, errOut, err = a.run("", "keys", "update", "p1", "--status", "disabled", "-o", "json")
	require.NoError(t, err, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &k))
	require.Equal(t, "disabled", k.Status)
	require.Equal(t, 3, k.MaxConcurrentUses)
	require.Equal(t, []string{"gpt-4o-2024-08-06", "gpt-4o-mini"}, k.Models)
	_, errOut, err = a.run("", "keys", "update", "p1", "--status", "cooldown", "--cooldown-until", "2030-01-02T03:04:05Z", "--limit", "4", "--models", "m1,m2")
	require.NoError(t, err, errOut)
	got := a.keys()["p1"]
	require.Equal(t, "cooldown", got.Status)
	require.Equal(t, time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC), got.CooldownUntil.UTC())
	require.Equal(t, 4, got.MaxConcurrentUses)
	require.Equal(t, []string{"m1", "m2"}, got.Models)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"p1"}, "want a flag to change"},
		{[]string{"p1", "-o", "json"}, "want a flag to change"},
		{[]string{"p1", "--cooldown-until", "tomorrow", "--status", "cooldown"}, "--cooldown-until: want an RFC 3339 time"},
		{[]string{"p1", "--models", ","}, "--models: want at least one model"},
		{[]string{"p1", "--cooldown-until", "2030-01-02T03:04:05Z"}, "cooldown_until"},
		{[]string{"p1", "--limit", "0"}, "max_concurrent_uses"},
	} {
		_, _, err = a.run("", append([]string{"keys", "update"}, tt.args...)...)
		require.ErrorContains(t, err, tt.want, tt.args)
	}
	_, _, err = a.run("", "keys", "update", "nope", "--status", "disabled")
	require.ErrorIs(t, err, client.ErrKeyNotFound)

	out, _, err = a.run("", "keys", "clear-leases", "p1")
	require.NoError(t, err)
	require.Equal(t, "cleared 0 lease(s) of p1\n", out)
	out, _, err = a.run("", "aliases", "set", "openai", "fast", "gpt-4o-mini")
	require.NoError(t, err)
	require.Equal(t, "openai/fast → gpt-4o-mini\n", out)
	out, _, err = a.run("", "aliases", "list")
	require.NoError(t, err)
	require.Equal(t, "PROVIDER  ALIAS   MODEL\n"+
		"openai    fast    gpt-4o-mini\n"+
		"openai    gpt-4o  gpt-4o-2024-08-06\n", out, "the demo's alias too")
	out, _, err = a.run("", "aliases", "delete", "openai", "fast", "-o", "json")
	require.NoError(t, err)
	require.JSONEq(t, `{"provider":"openai","deleted":"fast"}`, out)
	out, _, err = a.run("", "aliases", "list", "-o", "json")
	require.NoError(t, err)
	require.JSONEq(t, `[{"provider":"openai","alias":"gpt-4o","model":"gpt-4o-2024-08-06"}]`, out)
	_, _, err = a.run("", "aliases", "delete", "openai", "fast")
	require.ErrorIs(t, err, client.ErrAliasNotFound)
	_, _, err = a.run("", "aliases", "delete", "openai")
	require.ErrorContains(t, err, "want 2 argument(s), got 1")
	out, _, err = a.run("", "keys", "delete", "p2", "-o", "json")
	require.NoError(t, err)
	require.JSONEq(t, `{"deleted":"p2"}`, out)
	_, _, err = a.run("", "keys", "get", "p2")
	require.ErrorIs(t, err, client.ErrKeyNotFound)

	all, errAll, err := a.run("", "keys", "list", "-o", "json")
	require.NoError(t, err)
	require.NotContains(t, all+errAll, "sk-put-secret")
	require.NotContains(t, all+errAll, "sk-file-secret")

	// The admin key: from a file, never a flag.
	keyFile := writeFile(t, "admin-key", adminK+"\n")
	delete(a.env, "CREDPOOL_ADMIN_KEY")
	_, _, err = a.run("", "keys", "list")
	require.ErrorContains(t, err, "no admin key")
	_, _, err = a.run("", "keys", "list", "--admin-key-file", keyFile)
	require.NoError(t, err)
	_, _, err = a.run("", "keys", "list", "--admin-key", adminK)
	require.ErrorContains(t, err, "flag provided but not defined")
	a.env["CREDPOOL_ADMIN_KEY"] = "wrong-admin-key-000"
	_, _, err = a.run("", "keys", "list")
	require.ErrorIs(t, err, client.ErrUnauthorized)

	_, _, err = a.run("", "keys", "frobnicate")
	require.ErrorContains(t, err, "unknown command")
	_, _, err = a.run("", "keys", "get")
	require.ErrorContains(t, err, "want 1 argument")
}

// proxy is a loopback HTTP proxy to a's service: each request goes to
// handle with forward, which passes it on and writes the service's
// answer to the given writer. It returns the proxy's URL.
func (a *adminCLI) proxy(handle func(w http.ResponseWriter, r *http.Request, forward func(http.ResponseWriter))) string {
	a.t.Helper()
	target, err := url.Parse(a.env["CREDPOOL_URL"])
	require.NoError(a.t, err)
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handle(w, r, func(to http.ResponseWriter) { rp.ServeHTTP(to, r) })
	}))
	a.t.Cleanup(srv.Close)
	return srv.URL
}

// A write whose answer is lost (the proxy passes it on, the service
// answers, the proxy cuts the connection) says its outcome is unknown and
// how to check, never "unreachable": it was applied. A service that
// cannot be connected to is "unreachable", and nothing was sent.
func TestKeysWriteWithoutAnswer(t *testing.T) {
	a := startAdmin(t)
	direct := a.env["CREDPOOL_URL"]
	a.env["CREDPOOL_URL"] = a.proxy(func(w http.ResponseWriter, r *http.Request, forward func(http.ResponseWriter)) {
		if r.Method == http.MethodGet {
			forward(w)
			return
		}
		forward(httptest.NewRecorder())
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	})
	has := func(id string) func() bool { return func() bool { _, ok := a.keys()[id]; return ok } }
	for _, c := range []struct {
		stdin string
		args  []string
		check string
		// applied, if set, checks that the write was.
		applied func() bool
	}{
		{"sk-lost-answer\n", []string{"keys", "put", "p1", "--provider", "openai", "--models", "m"}, "check with credpool keys get p1", has("p1")},
		{"", []string{"keys", "clear-leases", "p1"}, "check the live leases with credpool keys get p1", nil},
		{"", []string{"aliases", "set", "openai", "fast", "m"}, "check with credpool aliases list", nil},
		{"", []string{"keys", "delete", "p1"}, "check with credpool keys get p1", func() bool { return !has("p1")() }},
		{"", []string{"keys", "import", writeFile(t, "keys.csv", importCSV(3))}, "wrote 0 of 3 keys, then lines 2 to 4", has("imp-0002")},
	} {
		out, errOut, err := a.run(c.stdin, c.args...)
		require.ErrorIs(t, err, client.ErrOutcomeUnknown, "%v", c.args)
		require.ErrorContains(t, err, "outcome unknown")
		require.ErrorContains(t, err, c.check)
		require.NotContains(t, err.Error(), "unreachable")
		require.Empty(t, out+errOut)
		if c.applied != nil {
			require.True(t, c.applied(), "%v was applied", c.args)
		}
	}

	// Nothing listens: no request went out.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, l.Close())
	a.env["CREDPOOL_URL"] = "http://" + l.Addr().String()
	_, _, err = a.run("sk-never\n", "keys", "put", "p2", "--provider", "openai", "--models", "m")
	require.ErrorIs(t, err, client.ErrUnreachable)
	require.ErrorContains(t, err, "unreachable")
	require.NotContains(t, err.Error(), "outcome unknown")
	a.env["CREDPOOL_URL"] = direct
	require.NotContains(t, a.keys(), "p2")
}

// cliProcess is "credpool args..." run as a process against a's service,
// its standard error read line by line.
type cliProcess struct {
	cmd    *exec.Cmd
	lines  chan string // closed at the end of standard error
	exited chan error  // Wait's result
}

func (a *adminCLI) start(url string, args ...string) *cliProcess {
	a.t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "CREDPOOL_TEST_MAIN=1", "CREDPOOL_URL="+url, "CREDPOOL_ADMIN_KEY="+a.env["CREDPOOL_ADMIN_KEY"])
	stderr, err := cmd.StderrPipe()
	require.NoError(a.t, err)
	require.NoError(a.t, cmd.Start())
	p := &cliProcess{cmd: cmd, lines: make(chan string, 64), exited: make(chan error, 1)}
	go func() {
		for s := bufio.NewScanner(stderr); s.Scan(); {
			p.lines <- s.Text()
		}
		close(p.lines)
		p.exited <- cmd.Wait()
	}()
	a.t.Cleanup(func() { _ = cmd.Process.Kill() })
	return p
}

// line waits for the next line of standard error, failing at its end.
func (p *cliProcess) line(t *testing.T) string {
	t.Helper()
	line, ok := <-p.lines
	require.True(t, ok, "standard error ended")
	return line
}

// wait waits for the process to end; it returns the rest of standard
// error and the exit status.
func (p *cliProcess) wait(t *testing.T) (string, int) {
	t.Helper()
	var rest []string
	for line := range p.lines {
		rest = append(rest, line)
	}
	err := <-p.exited
	var ee *exec.ExitError
	if err != nil {
		require.ErrorAs(t, err, &ee)
	}
	return strings.Join(rest, "\n"), p.cmd.ProcessState.ExitCode()
}

// Ctrl-C during a multi-batch import stops it after the batch in flight
// (written all or none), says how many keys were written and where the
// rest starts, and exits 130; a rerun writes the rest. A second Ctrl-C
// abandons the batch in flight, whose outcome is then unknown.
func TestKeysImportInterrupted(t *testing.T) {
	for _, twice := range []bool{false, true} {
		t.Run(map[bool]string{false: "once", true: "twice"}[twice], func(t *testing.T) {
			a := startAdmin(t)
			demo := len(a.keys())
			// The first batch is held at the proxy until released.
			held, release := make(chan struct{}), make(chan struct{})
			var bulk atomic.Int32
			url := a.proxy(func(w http.ResponseWriter, r *http.Request, forward func(http.ResponseWriter)) {
				if r.Method == http.MethodPut && r.URL.Path == "/api/admin/keys" && bulk.Add(1) == 1 {
					// Read whole, so that the server sees the client go.
					body, err := io.ReadAll(r.Body)
					if err != nil {
						return
					}
					r.Body = io.NopCloser(bytes.NewReader(body))
					close(held)
					select {
					case <-release:
					case <-r.Context().Done():
						return
					}
				}
				forward(w)
			})
			path := writeFile(t, "keys.csv", importCSV(2500))
			p := a.start(url, "keys", "import", path)
			<-held
			require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
			require.Equal(t, "credpool: interrupted (SIGINT): finishing lines 2 to 1001, written all or none; interrupt again to abandon them", p.line(t))
			if !twice {
				close(release)
				rest, code := p.wait(t)
				require.Equal(t, 130, code, rest)
				require.Equal(t, "credpool: interrupted (SIGINT): stopped before line 1002: wrote 1000 of 2500 keys; run the import again to write the rest (keys already written match and are left alone)", rest)
				keys := a.keys()
				require.Len(t, keys, demo+1000)
				require.Contains(t, keys, "imp-0999")
				out, errOut, err := a.run("", "keys", "import", path)
				require.NoError(t, err, errOut)
				require.Equal(t, "1500 key(s) created, 0 updated, 1000 unchanged\n", out)
				return
			}
			require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
			rest, code := p.wait(t)
			require.Equal(t, 130, code, rest)
			require.Contains(t, rest, "credpool: interrupted (SIGINT): wrote 0 of 2500 keys, then lines 2 to 1001: client: no answer to a request sent: outcome unknown")
			require.Contains(t, rest, "they are written all or none (credpool keys list shows which): run the import again to finish")
			require.Len(t, a.keys(), demo, "the proxy never passed the batch on")
		})
	}
}

// An interrupt stops a command blocked reading its input (a FIFO or pipe
// nobody writes to): put's secret file and import's rows alike, at once,
// with nothing written.
func TestKeysInterruptedWhileReadingInput(t *testing.T) {
	a := startAdmin(t)
	for name, args := range map[string][]string{
		"put":    {"keys", "put", "k1", "--provider", "openai", "--models", "m", "--secret-file"},
		"import": {"keys", "import", "--format", "csv"},
	} {
		t.Run(name, func(t *testing.T) {
			fifo := filepath.Join(t.TempDir(), "input")
			require.NoError(t, syscall.Mkfifo(fifo, 0o600))
			p := a.start(a.env["CREDPOOL_URL"], append(args, fifo)...)
			// A writer's open succeeds once the command has opened the
			// FIFO to read it; the writer then writes nothing.
			var w *os.File
			require.Eventually(t, func() bool {
				fd, err := syscall.Open(fifo, syscall.O_WRONLY|syscall.O_NONBLOCK, 0)
				if err != nil {
					return false
				}
				w = os.NewFile(uintptr(fd), fifo)
				return true
			}, time.Minute, 10*time.Millisecond, "the command never opened its input")
			defer w.Close()
			// One that does not stop is killed: it then fails, not hangs.
			stuck := time.AfterFunc(time.Minute, func() { _ = p.cmd.Process.Kill() })
			defer stuck.Stop()
			require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
			rest, code := p.wait(t)
			require.Equal(t, 130, code, rest)
			require.Contains(t, rest, "interrupted (SIGINT)")
			require.NotContains(t, a.keys(), "k1")
		})
	}
}

// The first interrupt ends a command's ctx, the second its batches, and
// after the second the signals get their default action back, so that a
// third kills a command stuck where it does not watch ctx.
func TestWatchGivesSignalsBackAfterTwo(t *testing.T) {
	sigs := make(chan os.Signal, 3)
	given := make(chan struct{})
	c := cli{interrupts: sigs, unwatched: func() { close(given) }}
	ctx, batches, cancel := c.watch(context.Background())
	defer cancel()

	sigs <- syscall.SIGINT
	<-ctx.Done()
	var cause *interrupted
	require.ErrorAs(t, context.Cause(ctx), &cause)
	require.NoError(t, batches.Err(), "the batch in flight goes on")
	select {
	case <-given:
		t.Fatal("signals given back after one")
	default:
	}

	sigs <- syscall.SIGTERM
	<-batches.Done()
	require.ErrorAs(t, context.Cause(batches), &cause)
	require.Equal(t, syscall.SIGTERM, cause.sig)
	select {
	case <-given:
	case <-time.After(time.Minute):
		t.Fatal("signals not given back after two")
	}
}

// keys list marks a key held back after the lease store lost its leases:
// its status still reads available, yet it grants nothing until then.
func TestKeysListShowsAHeldKey(t *testing.T) {
	r := redistest.Start(t)
	p := startServe(t, []string{"CREDPOOL_INTERNAL_KEY=" + internalK, "CREDPOOL_ADMIN_KEY=" + adminK, "CREDPOOL_SECRET_KEY=" + secretK},
		"--db", filepath.Join(t.TempDir(), "credpool.db"), "--redis", "redis://"+r.Addr)
	a := &adminCLI{t: t, env: map[string]string{"CREDPOOL_URL": "http://" + p.addr, "CREDPOOL_ADMIN_KEY": adminK}, http: openapitest.Client(nil)}
	_, errOut, err := a.run("sk-held-secret\n", "keys", "put", "h1", "--provider", "openai", "--models", "m")
	require.NoError(t, err, errOut)
	code, out := p.allocate(t, `{"provider":"openai","model":"m"}`)
	require.Equal(t, http.StatusOK, code, "%v", out)
	require.Equal(t, "-", a.heldCell("h1"), "not held")

	require.NoError(t, r.Client(t).FlushAll(t.Context()).Err())
	code, out = p.allocate(t, `{"provider":"openai","model":"m"}`)
	require.Equal(t, http.StatusTooManyRequests, code, "the lost lease may be in use: %v", out)
	held := a.heldCell("h1")
	until, err := time.Parse(time.RFC3339, held)
	require.NoError(t, err, "a held key shows when it grants again: %q", held)
	require.WithinDuration(t, time.Now().Add(time.Hour), until, time.Minute, "held for the longest lease (--max-lease)")

	_, errOut, err = a.run("", "keys", "clear-leases", "h1")
	require.NoError(t, err, errOut)
	require.Equal(t, "-", a.heldCell("h1"), "lifted")
}

// heldCell is key id's HELD_UNTIL cell in "keys list".
func (a *adminCLI) heldCell(id string) string {
	a.t.Helper()
	out, errOut, err := a.run("", "keys", "list")
	require.NoError(a.t, err, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	col := slices.Index(strings.Fields(lines[0]), "HELD_UNTIL")
	require.GreaterOrEqual(a.t, col, 0, "no HELD_UNTIL column in:\n%s", out)
	for _, line := range lines[1:] {
		if f := strings.Fields(line); f[0] == id {
			return f[col]
		}
	}
	a.t.Fatalf("no key %s in:\n%s", id, out)
	return ""
}
