// Package logqueue writes a service's log lines in the background, so that
// a log reader that stalls (a full pipe, a blocking log driver) never holds
// up a request: the request path only queues its line.
package logqueue

import (
	"context"
	"io"
	"sync/atomic"
)

// Writer is an io.Writer for a log handler (one Write a line, as slog's
// handlers do) whose Write never blocks: each line is copied into a queue
// that one goroutine writes to the underlying writer, in order, the lines
// queued meanwhile in one write (up to batch bytes). When the queue is
// full, because the reader stalled, the line is dropped and counted
// instead. The goroutine lives as long as the process. A Writer is safe
// for concurrent use.
type Writer struct {
	lines   chan line
	dropped atomic.Int64
}

// line is a queued line, or a flush's marker (done set).
type line struct {
	b    []byte
	done chan struct{}
}

// batch bounds the bytes of one write.
const batch = 64 << 10

// New returns a Writer to w that queues up to n lines.
func New(w io.Writer, n int) *Writer {
	q := &Writer{lines: make(chan line, n)}
	go q.write(w)
	return q
}

// write writes the queued lines to w, those queued meanwhile together.
func (q *Writer) write(w io.Writer) {
	var buf []byte
	for l := range q.lines {
		buf = append(buf[:0], l.b...)
		done := l.done
	more:
		for done == nil && len(buf) < batch {
			select {
			case l = <-q.lines:
				buf, done = append(buf, l.b...), l.done
			default:
				break more
			}
		}
		if len(buf) > 0 {
			// A reader gone away fails the write (EPIPE, once SIGPIPE is
			// ignored); the lines are lost with it.
			_, _ = w.Write(buf)
		}
		if done != nil {
			close(done)
		}
	}
}

// Write queues a copy of p, or drops it if the queue is full. It always
// reports p written.
func (q *Writer) Write(p []byte) (int, error) {
	select {
	case q.lines <- line{b: append([]byte(nil), p...)}:
	default:
		q.dropped.Add(1)
	}
	return len(p), nil
}

// Dropped returns how many lines were dropped so far.
func (q *Writer) Dropped() int64 { return q.dropped.Load() }

// Flush waits until every line queued before it was written, or ctx ends.
func (q *Writer) Flush(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case q.lines <- line{done: done}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
