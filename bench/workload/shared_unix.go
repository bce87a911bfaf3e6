//go:build unix

package workload

import (
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// mapCounters maps path's keys int64 counters MAP_SHARED. Atomic operations
// on shared pages are atomic across processes too.
func mapCounters(path string, keys int) ([]atomic.Int64, func() error, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, nil, err
	}
	// The mapping outlives the descriptor.
	defer f.Close()
	mem, err := syscall.Mmap(int(f.Fd()), 0, keys*8, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	// Pages are aligned, so every counter is 8-byte aligned.
	cells := unsafe.Slice((*atomic.Int64)(unsafe.Pointer(&mem[0])), keys)
	return cells, func() error { return syscall.Munmap(mem) }, nil
}
