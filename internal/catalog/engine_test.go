package catalog

import "testing"

func TestBind(t *testing.T) {
	for _, tt := range []struct {
		postgres bool
		in, want string
	}{
		{false, `UPDATE t SET a = ? WHERE id = ?`, `UPDATE t SET a = ? WHERE id = ?`},
		{true, `UPDATE t SET a = ? WHERE id = ?`, `UPDATE t SET a = $1 WHERE id = $2`},
		{true, `SELECT gen FROM catalog_generation`, `SELECT gen FROM catalog_generation`},
		{true, `VALUES (?, ?, ?)`, `VALUES ($1, $2, $3)`},
		{true, `?`, `$1`},
	} {
		if got := bind(tt.postgres, tt.in); got != tt.want {
			t.Errorf("bind(%v, %q) = %q, want %q", tt.postgres, tt.in, got, tt.want)
		}
	}
}

// The PostgreSQL schema is the SQLite one but for the spelling of the
// random stamp, which must have been found.
func TestPostgresSteps(t *testing.T) {
	pg := postgresSteps()
	replaced := 0
	for i, step := range schema.Steps {
		for j, stmt := range step {
			if pg[i][j] != stmt {
				replaced++
			}
		}
	}
	if replaced != 1 {
		t.Fatalf("%d statements respelled, want 1", replaced)
	}
}
