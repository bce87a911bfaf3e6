//go:build !linux

package bench

import "os/exec"

// dieWithParent has no portable equivalent outside Linux; there a killed
// harness can leave its credpool serve running.
func dieWithParent(*exec.Cmd) {}
