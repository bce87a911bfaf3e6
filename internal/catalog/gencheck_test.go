package catalog

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Every caller gets a read that started after it asked; reads never
// overlap; concurrent callers share reads.
func TestGenCheckCoalesces(t *testing.T) {
	var started, running, overlaps atomic.Int64
	g := genCheck{read: func(context.Context) (generation, error) {
		n := started.Add(1)
		if running.Add(1) > 1 {
			overlaps.Add(1)
		}
		defer running.Add(-1)
		time.Sleep(time.Millisecond)
		return generation{gen: n}, nil
	}}
	const callers, rounds = 32, 20
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		wg.Go(func() {
			for range rounds {
				before := started.Load()
				got, err := g.get(t.Context())
				if err == nil && got.gen <= before {
					err = errors.New("served by a read that started before the call")
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := overlaps.Load(); n > 0 {
		t.Fatalf("%d reads ran alongside another", n)
	}
	if n := started.Load(); n >= callers*rounds {
		t.Fatalf("%d reads for %d calls: none shared", n, callers*rounds)
	}
}

// A caller whose ctx ends leaves at once; the read goes on and serves the
// others.
func TestGenCheckCallerLeaves(t *testing.T) {
	release := make(chan struct{})
	g := genCheck{read: func(context.Context) (generation, error) {
		<-release
		return generation{gen: 7}, nil
	}}
	ctx, cancel := context.WithCancel(t.Context())
	left := make(chan error, 1)
	go func() {
		_, err := g.get(ctx)
		left <- err
	}()
	stayed := make(chan generation, 1)
	go func() {
		got, _ := g.get(t.Context())
		stayed <- got
	}()
	cancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("left with %v, want context.Canceled", err)
	}
	close(release)
	if got := <-stayed; got.gen != 7 {
		t.Fatalf("the other caller got %+v", got)
	}
}
