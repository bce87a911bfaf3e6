package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// openPTY opens a new pseudo-terminal: its master and its slave.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	master = os.NewFile(uintptr(fd), "/dev/ptmx")
	t.Cleanup(func() { _ = master.Close() })
	require.NoError(t, unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0), "unlockpt")
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	require.NoError(t, err, "ptsname")
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	require.NoError(t, err)
	return master, slave
}

// echoing reports whether terminal f echoes what is typed.
func echoing(t *testing.T, f *os.File) bool {
	t.Helper()
	tio, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	require.NoError(t, err)
	return tio.Lflag&unix.ECHO != 0
}

// startPut runs "credpool keys put k1 …" against a's service on terminal
// slave, in a session of its own whose controlling terminal it is (so
// that Ctrl-C there signals it, as in a shell); exited gets Wait's result.
func startPut(t *testing.T, a *adminCLI, slave *os.File) (cmd *exec.Cmd, exited <-chan error) {
	t.Helper()
	cmd = exec.Command(os.Args[0], "keys", "put", "k1", "--provider", "openai", "--models", "m")
	cmd.Env = append(os.Environ(), "CREDPOOL_TEST_MAIN=1", "CREDPOOL_URL="+a.env["CREDPOOL_URL"], "CREDPOOL_ADMIN_KEY="+adminK)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return cmd, done
}

// Ctrl-C at put's secret prompt, typed on the command's controlling
// terminal, puts the terminal back as it was (echo on), ends the prompt's
// line, writes nothing and exits 130.
func TestKeysPutPromptInterrupted(t *testing.T) {
	a := startAdmin(t)
	master, slave := openPTY(t)
	require.True(t, echoing(t, slave), "a new terminal echoes")

	_, exited := startPut(t, a, slave)

	var out bytes.Buffer
	read := make(chan error, 1)
	prompted := make(chan struct{})
	go func() {
		buf, waiting := make([]byte, 256), true
		for {
			n, err := master.Read(buf)
			out.Write(buf[:n])
			if waiting && strings.Contains(out.String(), "secret of k1: ") {
				close(prompted)
				waiting = false
			}
			if err != nil {
				read <- err
				return
			}
		}
	}()
	select {
	case <-prompted:
	case err := <-exited:
		t.Fatalf("exited before its prompt: %v", err)
	}
	// The prompt is written, then echo turned off: wait for both.
	for echoing(t, slave) {
		select {
		case err := <-exited:
			t.Fatalf("exited at its prompt: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}

	_, err := master.Write([]byte{3}) // Ctrl-C
	require.NoError(t, err)
	err = <-exited
	require.True(t, echoing(t, slave), "echo is back on")
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, 130, ee.ExitCode(), "%v", err)

	// The slave closed, the master reads what is left, then fails.
	require.NoError(t, slave.Close())
	require.Error(t, <-read)
	_, after, _ := strings.Cut(out.String(), "secret of k1: ")
	require.True(t, strings.HasPrefix(after, "\r\n"), "the prompt's line is ended: %q", after)
	require.Contains(t, after, "credpool: interrupted (SIGINT)")
	require.NotContains(t, a.keys(), "k1")
}

// A prompt ended by a signal other than a typed Ctrl-C (here SIGTERM, as
// a supervisor or timeout sends) drops the secret half typed: left in the
// terminal's input, the shell would read it next, echo it and perhaps keep
// it in its history.
func TestKeysPutPromptTerminatedDropsWhatWasTyped(t *testing.T) {
	a := startAdmin(t)
	master, slave := openPTY(t)
	cmd, exited := startPut(t, a, slave)
	// What it writes is read, so that it never blocks on a full terminal.
	go func() { _, _ = io.Copy(io.Discard, master) }()
	for echoing(t, slave) {
		select {
		case err := <-exited:
			t.Fatalf("exited before its prompt: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}

	_, err := master.Write([]byte("sk-half-typ"))
	require.NoError(t, err)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	err = <-exited
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, 143, ee.ExitCode(), "%v", err)

	// The next reader of the terminal (the shell) gets a line of its own.
	_, err = master.Write([]byte("\n"))
	require.NoError(t, err)
	line := make([]byte, 64)
	n, err := slave.Read(line)
	require.NoError(t, err)
	require.Equal(t, "\n", string(line[:n]), "what was typed at the prompt is gone")
}
