package catalog

import (
	"context"
	"sync"
	"time"
)

// genCheck coalesces the generation reads of concurrent requests. A caller
// needs a read that starts after it asked, so that it sees every write
// committed before then; a read already running may have started before
// and does not do. So one read runs at a time, and the callers that ask
// while it runs share the next one, started when it ends: under load
// there is about one read per round trip to the database however many
// requests there are, and a caller waits for at most the read running
// when it came and its own. A caller that finds none running starts one
// at once. Reads run in a goroutine of their own, bounded by
// genReadTimeout, so a caller whose ctx ends leaves at once and the others
// still get the answer.
type genCheck struct {
	read func(ctx context.Context) (generation, error)

	mu      sync.Mutex
	running bool
	next    *genRead // the read the next callers share; nil if none waits
}

// generation is the catalog's generation and stamp, as one read found it.
type generation struct {
	gen   int64
	stamp string
}

type genRead struct {
	done chan struct{}
	got  generation
	err  error
}

// genReadTimeout bounds one shared read of the generation.
const genReadTimeout = 10 * time.Second

// get returns a generation read that started after get was called, or
// ctx's error if ctx ends first.
func (g *genCheck) get(ctx context.Context) (generation, error) {
	if err := ctx.Err(); err != nil {
		// Not left to the select below, which picks at random when a
		// read is done too.
		return generation{}, err
	}
	g.mu.Lock()
	r := g.next
	if r == nil {
		r = &genRead{done: make(chan struct{})}
		g.next = r
	}
	if !g.running {
		g.running, g.next = true, nil
		go g.run(r)
	}
	g.mu.Unlock()
	select {
	case <-r.done:
		return r.got, r.err
	case <-ctx.Done():
		return generation{}, ctx.Err()
	}
}

// run performs r, then each batch that queued meanwhile.
func (g *genCheck) run(r *genRead) {
	for r != nil {
		ctx, cancel := context.WithTimeout(context.Background(), genReadTimeout)
		r.got, r.err = g.read(ctx)
		cancel()
		close(r.done)
		g.mu.Lock()
		r, g.next = g.next, nil
		g.running = r != nil
		g.mu.Unlock()
	}
}
