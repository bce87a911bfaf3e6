package workload

import (
	"fmt"
	"os"
	"sync/atomic"
)

// Holders is the harness's own count of callers holding each key, kept
// apart from any store. A caller adds itself right after a grant and
// removes itself before it releases (a crashed caller's lease counts until
// shortly before it expires, since its slot is taken until then), so for a
// correct store the count never exceeds the limit; a count above it is an
// oversold slot. Holders is safe for
// concurrent use, and one made by OpenHolders is shared with every process
// that opens the same file.
type Holders struct {
	cells []atomic.Int64
	limit int64
	unmap func() error
}

// NewHolders counts holders of keys keys in this process only.
func NewHolders(keys, limit int) *Holders {
	return &Holders{cells: make([]atomic.Int64, keys), limit: int64(limit), unmap: func() error { return nil }}
}

// CreateHoldersFile creates the zeroed file that OpenHolders maps, one
// counter per key.
func CreateHoldersFile(path string, keys int) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("workload: holder file: %w", err)
	}
	err = f.Truncate(int64(keys) * 8)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("workload: holder file: %w", err)
	}
	return nil
}

// OpenHolders maps the counters in path (made by CreateHoldersFile) into
// memory shared with every other process that opens it, so the count spans
// processes. Close unmaps it.
func OpenHolders(path string, keys, limit int) (*Holders, error) {
	cells, unmap, err := mapCounters(path, keys)
	if err != nil {
		return nil, fmt.Errorf("workload: holder file: %w", err)
	}
	return &Holders{cells: cells, limit: int64(limit), unmap: unmap}, nil
}

// Acquire counts one more holder of key i and returns the new count and
// whether it exceeds the limit.
func (h *Holders) Acquire(i int) (n int64, over bool) {
	n = h.cells[i].Add(1)
	return n, n > h.limit
}

// Drop counts one holder of key i fewer.
func (h *Holders) Drop(i int) { h.cells[i].Add(-1) }

// Close releases shared memory; the counts must not be used after it.
func (h *Holders) Close() error { return h.unmap() }
