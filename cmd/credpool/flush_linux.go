package main

import "golang.org/x/sys/unix"

// discardInput drops what was typed on terminal fd and not read yet: a
// secret half typed at an interrupted prompt must not reach the shell.
func discardInput(fd int) error { return unix.IoctlSetInt(fd, unix.TCFLSH, unix.TCIFLUSH) }
