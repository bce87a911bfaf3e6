//go:build !linux

package main

import "testing"

// livingChildren needs /proc; elsewhere the check that no process is left
// behind compares nothing.
func livingChildren(*testing.T) []int { return nil }
