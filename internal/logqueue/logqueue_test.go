package logqueue_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/credpool/credpool/internal/logqueue"
)

// A reader that stalls (a pipe nobody reads) never holds up a Write: the
// lines past the queue and the pipe's buffer are dropped and counted.
// Once the reader reads again, Flush waits for the queued lines, which
// arrive whole and in order.
func TestStalledReaderNeverBlocksAWrite(t *testing.T) {
	r, w := pipe(t)
	q := logqueue.New(w, 100)
	const n = 20000 // far more than a pipe's 64 KiB and the queue hold
	for i := range n {
		_, err := fmt.Fprintf(q, "line %06d %0100d\n", i, 0)
		require.NoError(t, err)
	}
	require.Positive(t, q.Dropped(), "the reader stalled")

	got := make(chan []string, 1)
	go func() {
		var lines []string
		s := bufio.NewScanner(r)
		for s.Scan() {
			lines = append(lines, s.Text())
		}
		got <- lines
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, q.Flush(ctx))
	require.NoError(t, w.Close())
	lines := <-got
	require.Equal(t, int64(n), int64(len(lines))+q.Dropped(), "each line written or counted")
	last := -1
	for _, l := range lines {
		var i, zero int
		_, err := fmt.Sscanf(l, "line %06d %0100d", &i, &zero)
		require.NoError(t, err, "a whole line: %q", l)
		require.Greater(t, i, last, "in order")
		last = i
	}
}

// Flush gives up when ctx ends while the reader still stalls. The writer
// here holds every write until the test ends (a pipe nobody reads did
// not always stall: on a loaded box the queue dropped all but a few lines
// before the writer started, and those fit in the pipe).
func TestFlushBoundedByContext(t *testing.T) {
	w := &heldWriter{release: make(chan struct{})}
	t.Cleanup(func() { close(w.release) })
	q := logqueue.New(w, 4)
	_, err := fmt.Fprintf(q, "%0200d\n", 0)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, q.Flush(ctx), context.DeadlineExceeded)
}

// pipe is an OS pipe that nobody reads until the test does, closed when
// the test ends.
func pipe(t *testing.T) (r, w *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = r.Close()
		_ = w.Close()
	})
	return r, w
}

// Lines queued while a write is under way go out together, in one write.
func TestQueuedLinesGoInOneWrite(t *testing.T) {
	w := &heldWriter{release: make(chan struct{})}
	q := logqueue.New(w, 1000)
	for i := range 100 {
		_, err := fmt.Fprintf(q, "line %d\n", i)
		require.NoError(t, err)
	}
	close(w.release)
	require.NoError(t, q.Flush(t.Context()))
	w.mu.Lock()
	defer w.mu.Unlock()
	require.LessOrEqual(t, w.writes, 2, "the first line, then the rest")
	var want strings.Builder
	for i := range 100 {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	require.Equal(t, want.String(), w.buf.String())
}

// heldWriter holds its first write until release is closed.
type heldWriter struct {
	release chan struct{}
	mu      sync.Mutex
	writes  int
	buf     bytes.Buffer
}

func (w *heldWriter) Write(p []byte) (int, error) {
	<-w.release
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes++
	return w.buf.Write(p)
}
