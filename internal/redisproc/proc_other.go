//go:build !linux

package redisproc

import "os/exec"

// dieWithParent has no portable equivalent outside Linux; there a killed
// test can leave its server running.
func dieWithParent(*exec.Cmd) {}
