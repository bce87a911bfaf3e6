package bench

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel stop a credpool serve process the harness
// started if the harness dies before it can (a SIGKILL, a crash).
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
