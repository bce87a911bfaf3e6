package test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/credpool/credpool"

// goList runs "go list" with args and returns one line per package.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	require.NoError(t, err, "the layout test asks the go command for the import graph")
	out, err := exec.Command(gobin, append([]string{"list"}, args...)...).CombinedOutput()
	require.NoError(t, err, "go list %v:\n%s", args, out)
	return strings.Fields(string(out))
}

// The arrows of DESIGN.md ("Responsibilities") only point down: the
// library knows nothing of the service, the catalog no lease store, the
// serving path no benchmark, and the binary never links the testing
// package or the test helpers.
func TestLayering(t *testing.T) {
	forbidden := []struct {
		pkg     string
		mustNot []string // import paths; each also forbids the packages below it
	}{
		{module + "/cmd/credpool", []string{"testing", module + "/test", "github.com/stretchr/testify"}},
		{module + "/optimistic", []string{module + "/internal/broker", module + "/internal/catalog", module + "/internal/sqlitestore",
			module + "/handlers", module + "/bench", module + "/cmd", "testing"}},
		{module + "/internal/catalog", []string{module + "/internal/sqlitestore", module + "/bench", module + "/internal/broker", module + "/handlers"}},
		{module + "/internal/sqlitestore", []string{module + "/internal/catalog", module + "/internal/broker"}},
		{module + "/internal/server", []string{module + "/bench", module + "/cmd", module + "/test", "testing"}},
		{module + "/internal/broker", []string{module + "/bench", module + "/handlers", module + "/internal/server", module + "/internal/sqlitestore"}},
		{module + "/handlers", []string{module + "/bench", module + "/internal/server", module + "/internal/sqlitestore"}},
		{module + "/internal/requestlog", []string{module + "/internal/broker", module + "/internal/catalog", module + "/internal/sqlitestore", module + "/handlers"}},
		{module + "/internal/postgres", []string{module + "/internal/catalog", module + "/internal/broker", module + "/internal/sqlitex", "testing"}},
		{module + "/internal/pgproc", []string{module + "/internal/catalog", "testing"}},
		// The public client knows nothing of the service's insides (and
		// client's own test checks it needs the standard library alone).
		{module + "/client", []string{module + "/internal", module + "/optimistic", module + "/handlers", module + "/cmd", "testing"}},
	}
	for _, f := range forbidden {
		deps := goList(t, "-deps", "-f", "{{.ImportPath}}", f.pkg)
		require.NotEmpty(t, deps, f.pkg)
		for _, dep := range deps {
			for _, bad := range f.mustNot {
				hit := dep == bad || strings.HasPrefix(dep, bad+"/")
				require.False(t, hit, "%s depends on %s", f.pkg, dep)
			}
		}
	}

	// Handlers and the broker depend on small interfaces, not on Redis or
	// SQL: neither imports a driver or database/sql itself.
	for _, pkg := range []string{module + "/handlers", module + "/internal/broker"} {
		imports := goList(t, "-f", `{{join .Imports "\n"}}`, pkg)
		for _, bad := range []string{"github.com/redis/go-redis/v9", "database/sql", "modernc.org/sqlite"} {
			require.False(t, slices.Contains(imports, bad), "%s imports %s", pkg, bad)
		}
	}
}
