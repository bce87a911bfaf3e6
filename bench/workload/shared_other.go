//go:build !unix

package workload

import (
	"errors"
	"sync/atomic"
)

// mapCounters needs mmap; without it a run stays in one process.
func mapCounters(string, int) ([]atomic.Int64, func() error, error) {
	return nil, nil, errors.New("sharing holder counts across processes needs a unix system")
}
