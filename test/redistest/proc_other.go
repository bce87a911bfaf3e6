//go:build !linux

package redistest

import "os/exec"

// dieWithParent has no portable equivalent outside Linux; there a killed
// test can leave its server running.
func dieWithParent(*exec.Cmd) {}
