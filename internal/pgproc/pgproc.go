// Package pgproc starts throwaway PostgreSQL servers, as redisproc does
// redis-servers: initdb into a new temporary directory, then postgres on a
// free loopback port, durability off (the data is thrown away), stopped
// and removed by Stop. Run as root, it runs the server as the postgres
// user (Debian's postgresql package creates it), since PostgreSQL refuses
// to run as root. The tests (through test/pgtest) use it.
package pgproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// InstallHint says how to get the binaries; it ends every "not found" error.
const InstallHint = "install PostgreSQL's server (Debian/Ubuntu: sudo apt-get install -y postgresql; macOS: brew install postgresql), or set PG_BIN to the directory holding initdb and postgres"

// Server is one running PostgreSQL server. Its methods are safe for
// concurrent use.
type Server struct {
	// Addr is host:port on 127.0.0.1.
	Addr   string
	dir    string
	cmd    *exec.Cmd
	exited chan struct{}
}

// BinDir returns the directory holding initdb and postgres: $PG_BIN, else
// initdb's directory on PATH, else the newest /usr/lib/postgresql/*/bin
// (where Debian installs them, off PATH).
func BinDir() (string, error) {
	if d := os.Getenv("PG_BIN"); d != "" {
		if !executable(filepath.Join(d, "initdb")) || !executable(filepath.Join(d, "postgres")) {
			return "", fmt.Errorf("PG_BIN=%s holds no initdb and postgres: %s", d, InstallHint)
		}
		return d, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if p, err = filepath.EvalSymlinks(p); err == nil && executable(filepath.Join(filepath.Dir(p), "postgres")) {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return version(b) - version(a) })
	for _, d := range dirs {
		if executable(filepath.Join(d, "initdb")) && executable(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", errors.New("initdb and postgres not found on PATH or in /usr/lib/postgresql/*/bin: " + InstallHint)
}

// version is the major version in a /usr/lib/postgresql/<v>/bin path.
func version(dir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return v
}

func executable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// Run starts a server in a new temporary directory. The caller must Stop
// it; the kernel kills it if the calling process dies first (Linux).
func Run() (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	owner, err := runAs()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "credpool-pg-")
	if err != nil {
		return nil, err
	}
	s, err := initAndStart(bin, dir, owner)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// runAs is the user the server runs as: nil for the current one, the
// postgres user when running as root.
func runAs() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, PostgreSQL needs an unprivileged user named postgres: %w; %s", err, InstallHint)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func initAndStart(bin, dir string, owner *syscall.Credential) (*Server, error) {
	if owner != nil {
		if err := os.Chown(dir, int(owner.Uid), int(owner.Gid)); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
	initdb.Dir = dir
	initdb.SysProcAttr = attrs(owner)
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w: %s", err, lastLines(string(out), 5))
	}
	var last error
	// A free port can be taken between probing and binding.
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s, err := launch(bin, dir, port, owner)
		if err == nil {
			return s, nil
		}
		last = err
	}
	return nil, last
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func launch(bin, dir string, port int, owner *syscall.Credential) (*Server, error) {
	logPath := filepath.Join(dir, "postgres.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", filepath.Join(dir, "data"),
		"-p", strconv.Itoa(port), "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=300")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = attrs(owner)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	if err := s.waitReady(logPath); err != nil {
		s.kill()
		return nil, err
	}
	return s, nil
}

func (s *Server) waitReady(logPath string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		select {
		case <-s.exited:
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("postgres on %s exited at start: %s", s.Addr, lastLines(string(log), 5))
		case <-ctx.Done():
			return fmt.Errorf("postgres on %s not ready after 30s", s.Addr)
		case <-time.After(20 * time.Millisecond):
		}
		if err := s.exec(ctx, "SELECT 1"); err == nil {
			return nil
		}
	}
}

// URL is the URL of database name on the server, as the superuser.
func (s *Server) URL(name string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", s.Addr, name)
}

// CreateDB creates an empty database named name.
func (s *Server) CreateDB(ctx context.Context, name string) error {
	return s.exec(ctx, `CREATE DATABASE "`+name+`"`)
}

func (s *Server) exec(ctx context.Context, stmt string) error {
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, stmt)
	return err
}

// Stop shuts the server down (fast shutdown: sessions are ended), waits
// for it to exit and removes its directory. Stopping a stopped server
// only removes the directory.
func (s *Server) Stop() {
	select {
	case <-s.exited:
	default:
		_ = s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.exited:
		case <-time.After(10 * time.Second):
			s.kill()
		}
	}
	_ = os.RemoveAll(s.dir)
}

func (s *Server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
