package pgproc

import "syscall"

// attrs runs a process as owner (nil: as the caller), and makes the
// kernel kill it if the test process dies before its cleanup runs.
func attrs(owner *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: owner, Pdeathsig: syscall.SIGKILL}
}
