// Package keygate gives each key a turn within one process: at most one
// holder per key at a time, the others waiting in arrival order without
// holding anything else (no pooled connection), each wait ending with its
// ctx. A lease store takes a key's turn around its read-decide-write on
// that key, so that the process's own callers piling onto a hot key queue
// here instead of racing each other in the store.
//
// A gate exists only while someone holds or waits for it: a process that
// touches many keys over its life, or deletes them, keeps nothing behind.
package keygate

import (
	"context"
	"sync"
)

// Set holds the gates of one process (or one store). The zero value is
// ready to use; a Set is safe for concurrent use and must not be copied
// after first use.
type Set struct {
	mu sync.Mutex
	m  map[string]*gate
}

type gate struct {
	// turn has capacity 1 and is full while the gate is held. A release
	// hands the turn to the longest-waiting Enter at once (the runtime
	// queues blocked senders in order), so TryEnter cannot jump the queue.
	turn chan struct{}
	refs int // holders and waiters, guarded by Set.mu
}

func (s *Set) ref(key string) *gate {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[string]*gate)
	}
	g := s.m[key]
	if g == nil {
		g = &gate{turn: make(chan struct{}, 1)}
		s.m[key] = g
	}
	g.refs++
	return g
}

func (s *Set) unref(key string, g *gate) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.refs--; g.refs == 0 {
		delete(s.m, key)
	}
}

// releaser returns the func that gives g's turn up: it must be called
// exactly once.
func (s *Set) releaser(key string, g *gate) func() {
	return func() {
		<-g.turn
		s.unref(key, g)
	}
}

// Enter waits for key's turn, after those already waiting, and returns the
// func that gives it up. If ctx ends first it returns ctx.Err() and holds
// nothing.
func (s *Set) Enter(ctx context.Context, key string) (release func(), err error) {
	g := s.ref(key)
	select {
	case g.turn <- struct{}{}:
		return s.releaser(key, g), nil
	case <-ctx.Done():
		s.unref(key, g)
		return nil, ctx.Err()
	}
}

// TryEnter takes key's turn if nobody holds it, and returns the func that
// gives it up; ok is false, and nothing is held, if the turn is taken.
func (s *Set) TryEnter(key string) (release func(), ok bool) {
	g := s.ref(key)
	select {
	case g.turn <- struct{}{}:
		return s.releaser(key, g), true
	default:
		s.unref(key, g)
		return nil, false
	}
}

// Users is how many calls hold or wait for key's turn right now.
func (s *Set) Users(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.m[key]; g != nil {
		return g.refs
	}
	return 0
}

// Len is how many keys have a gate right now: those held or waited for.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
