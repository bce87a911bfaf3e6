package test

import (
	"os"
	"testing"

	"github.com/credpool/credpool/test/pgtest"
)

// TestMain stops the PostgreSQL server the tests start on first use.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
