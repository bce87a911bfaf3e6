//go:build !linux

package main

// discardInput is discardInput of flush_linux.go where there is no TCFLSH:
// what was typed is left.
func discardInput(int) error { return nil }
