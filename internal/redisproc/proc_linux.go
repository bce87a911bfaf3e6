package redisproc

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel kill the server if the test process dies
// before its cleanup runs (a timeout panic, a cancelled CI job).
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
