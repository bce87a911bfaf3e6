//go:build !linux

package pgproc

import "syscall"

// attrs runs a process as owner (nil: as the caller). Outside Linux there
// is no portable way to tie it to the test process's life.
func attrs(owner *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: owner}
}
