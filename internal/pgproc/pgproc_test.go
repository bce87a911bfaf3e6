package pgproc

import (
	"context"
	"os"
	"strings"
	"testing"
)

// A PG_BIN without the binaries is refused with the install hint, never
// replaced by another server.
func TestBinDirRefusesABadPGBin(t *testing.T) {
	t.Setenv("PG_BIN", t.TempDir())
	_, err := BinDir()
	if err == nil || !strings.Contains(err.Error(), InstallHint) {
		t.Fatalf("BinDir() = %v, want the install hint", err)
	}
	if _, err := Run(); err == nil {
		t.Fatal("Run started a server without binaries")
	}
}

// Stop shuts the server down and removes its directory; a second Stop
// does nothing.
func TestRunStop(t *testing.T) {
	s, err := Run()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateDB(context.Background(), "x"); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if _, err := os.Stat(s.dir); !os.IsNotExist(err) {
		t.Fatalf("directory left behind: %v", err)
	}
	if err := s.CreateDB(context.Background(), "y"); err == nil {
		t.Fatal("the server still answers after Stop")
	}
	s.Stop()
}
