package optimistic

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"
)

// holdOffSpan bounds the pause after a lost race, in units of the aborted
// attempt's own duration, so that it scales with the server's pace; it
// doubles up to holdOffDoublings times while the process keeps losing the
// key (Options.MaxBackoff caps it). The values are measured (README,
// "A process that loses a race steps back").
const (
	holdOffSpan      = 16
	holdOffDoublings = 1
)

// skipFor is how long a key this process skipped (read full, unusable,
// or not in the pool) is read without WATCH first (see allocation.decide):
// a hot key, polled all the time, stays noted; a key that freed up costs
// one more round trip on its next grant, within this long of the last
// time it was skipped.
const skipFor = 50 * time.Millisecond

// notesSweep is the number of keys noted past which a new note drops
// those that no longer matter.
const notesSweep = 1024

// notes keeps what this process learned of each key from its last
// attempts: until when it stays off a key on which it lost an EXEC race to
// another process (see hold), and when it last skipped the key (see
// skipped). It is safe for concurrent use; the zero value holds none.
type notes struct {
	mu sync.Mutex
	m  map[string]note
}

type note struct {
	until  time.Time
	losses int // races lost in a row, each soon after the last hold-off ended
	skip   time.Time
}

// sweep drops, once many keys are noted, the notes that no longer matter:
// hold-offs and skips older than skipFor. h.mu is held.
func (h *notes) sweep(now time.Time) {
	if h.m == nil {
		h.m = make(map[string]note)
	}
	if len(h.m) < notesSweep {
		return
	}
	for id, o := range h.m {
		if now.Sub(o.until) > skipFor && now.Sub(o.skip) > skipFor {
			delete(h.m, id)
		}
	}
}

// hold keeps this process off keyID after an attempt that took took and
// whose EXEC was aborted, for at most longest. The process that lost
// steps back while the winner's makes its next grants: if every loser
// came back at once, they would collide again on the next freed slot.
func (h *notes) hold(keyID string, took, longest time.Duration) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sweep(now)
	o := h.m[keyID]
	if o.until.IsZero() || now.Sub(o.until) > holdOffSpan*took {
		o.losses = 0
	}
	pause := float64(took) * (1 + rand.Float64()*(holdOffSpan-1)) * float64(int(1)<<min(o.losses, holdOffDoublings))
	o.until, o.losses = now.Add(min(time.Duration(pause), longest)), o.losses+1
	h.m[keyID] = o
}

// won forgets keyID's notes: this process just granted on it.
func (h *notes) won(keyID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.m, keyID)
}

// skipped notes that keyID was just read and skipped.
func (h *notes) skipped(keyID string) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sweep(now)
	o := h.m[keyID]
	o.skip = now
	h.m[keyID] = o
}

// freed forgets that keyID was skipped: a slot on it was just freed, so
// the next read takes it under WATCH at once, rather than first peeking
// at what is now stale.
func (h *notes) freed(keyID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if o, ok := h.m[keyID]; ok {
		o.skip = time.Time{}
		h.m[keyID] = o
	}
}

// skippedLately says whether keyID was skipped within skipFor.
func (h *notes) skippedLately(keyID string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return time.Since(h.m[keyID].skip) < skipFor
}

// until returns when this process's hold-off on keyID ends, the zero
// time if none is on.
func (h *notes) until(keyID string) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	if o := h.m[keyID]; o.until.After(time.Now()) {
		return o.until
	}
	return time.Time{}
}

// sleepUntil waits until t or until ctx ends, whichever comes first.
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
