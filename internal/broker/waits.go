package broker

import (
	"sync"

	"github.com/credpool/credpool/optimistic"
)

// StopWaiting ends for good the waits of allocate requests
// (Request.Wait), as the service begins to shut down: it should hand out
// no more slots than its requests in flight find free, and a caller told
// at once can go to another instance. A request waiting in line is
// answered ErrShuttingDown at once, or once its try in progress finds no
// slot; one that asks to wait from now on is answered so once a try
// finds none. A grant, or a slot a release was already handing over, is
// still the request's; a request ended holds no slot. Requests that do
// not wait are left alone. Calls after the first do nothing.
func (b *Broker) StopWaiting() { b.waits.stop() }

// waits are the places in line of the allocate requests that wait for a
// slot, so that StopWaiting can end them. The zero value is ready to use;
// it is safe for concurrent use.
type waits struct {
	mu      sync.Mutex
	stopped bool
	places  map[*optimistic.Place]struct{}
}

// add registers p until remove; once stopped, it ends p at once instead.
func (w *waits) add(p *optimistic.Place) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		p.End(ErrShuttingDown)
		return
	}
	if w.places == nil {
		w.places = make(map[*optimistic.Place]struct{})
	}
	w.places[p] = struct{}{}
}

func (w *waits) remove(p *optimistic.Place) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.places, p)
}

// stop ends every place registered, and those added later.
func (w *waits) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	for p := range w.places {
		p.End(ErrShuttingDown)
	}
}
