package broker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/credpool/credpool/optimistic"
)

// liveReadTimeout bounds one background read of the store's live state.
const liveReadTimeout = 2 * time.Second

// live is the lease store's live state of keys as this process last read
// it (Inspect), kept up by its own grants and releases since, so that
// ranking does not read the store on every allocate. A state older than
// maxAge is still used while a read of it runs in the background. A key
// the store passed over before the one it granted counts as full; the
// states of keys of an allocate that found none free are dropped, so the
// next allocate reads them. Ranking is all it serves: the store decides
// every grant on its own state. With maxAge zero or less it keeps
// nothing. It is safe for concurrent use.
type live struct {
	store  optimistic.LeaseStore
	maxAge time.Duration
	log    *slog.Logger

	mu    sync.Mutex
	keys  map[string]liveKey
	swept time.Time
	// queue holds the ids of stale states to read, in the background, by
	// one goroutine at a time, which runs while reading is set; queued
	// has the ids in queue or being read.
	queue   []string
	queued  map[string]bool
	reading bool
}

type liveKey struct {
	info optimistic.KeyInfo
	read time.Time // when the read that found info started
}

// liveForget is how long past maxAge a state no allocate asked for stays
// kept: keys deleted from the catalog leave no state behind for longer.
const liveForget = 100

func newLive(s optimistic.LeaseStore, maxAge time.Duration, log *slog.Logger) *live {
	return &live{store: s, maxAge: maxAge, log: log, keys: map[string]liveKey{}, queued: map[string]bool{}}
}

// get returns the known state of each of ids, and the indexes of those
// with none, which the caller reads from the store and puts. A state older
// than maxAge is returned and read again in the background.
func (l *live) get(ids []string) (infos []optimistic.KeyInfo, missing []int) {
	infos = make([]optimistic.KeyInfo, len(ids))
	if l.maxAge <= 0 {
		for i := range ids {
			missing = append(missing, i)
		}
		return infos, missing
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, id := range ids {
		k, ok := l.keys[id]
		if !ok {
			missing = append(missing, i)
			continue
		}
		infos[i] = k.info
		if now.Sub(k.read) > l.maxAge && !l.queued[id] {
			l.queued[id] = true
			l.queue = append(l.queue, id)
		}
	}
	if !l.reading && len(l.queue) > 0 {
		l.reading = true
		go l.refresh()
	}
	return infos, missing
}

// put keeps states read from the store by a read that started at read. A
// key whose server did not answer keeps none.
func (l *live) put(infos []optimistic.KeyInfo, read time.Time) {
	if l.maxAge <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, in := range infos {
		if in.Unreachable {
			delete(l.keys, in.ID)
			continue
		}
		if k, ok := l.keys[in.ID]; !ok || !k.read.After(read) {
			l.keys[in.ID] = liveKey{info: in, read: read}
		}
	}
	l.sweep(read)
}

// sweep drops, at most once per forget period, the states not read for
// that long.
func (l *live) sweep(now time.Time) {
	forget := liveForget * l.maxAge
	if now.Sub(l.swept) < forget {
		return
	}
	l.swept = now
	for id, k := range l.keys {
		if now.Sub(k.read) > forget && !l.queued[id] {
			delete(l.keys, id)
		}
	}
}

// refresh reads the queued states until none is left.
func (l *live) refresh() {
	for {
		l.mu.Lock()
		ids := l.queue
		l.queue = nil
		l.reading = len(ids) > 0
		l.mu.Unlock()
		if len(ids) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), liveReadTimeout)
		read := time.Now()
		infos, err := l.store.Inspect(ctx, ids...)
		cancel()
		if err != nil {
			// The next allocate that wants them reads them itself.
			l.log.Debug("read live state of keys", "keys", len(ids), "err", err)
			l.drop(ids...)
		} else {
			l.put(infos, read)
		}
		l.mu.Lock()
		for _, id := range ids {
			delete(l.queued, id)
		}
		l.mu.Unlock()
	}
}

// drop forgets the states of ids: the store did not find them as kept.
func (l *live) drop(ids ...string) {
	if l.maxAge <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		delete(l.keys, id)
	}
}

// full notes that the store found no free slot on keys ids, which rank
// them last until a release by this process or the next read.
func (l *live) full(ids ...string) {
	for _, id := range ids {
		l.adjust(id, func(in *optimistic.KeyInfo) { in.Live = max(in.Live, in.Limit) })
	}
}

// granted notes a grant of key id at at by this process.
func (l *live) granted(id string, at time.Time) {
	l.adjust(id, func(in *optimistic.KeyInfo) {
		in.Live++
		in.LastUsedAt = later(in.LastUsedAt, at)
	})
}

// released notes a release of a lease of key id by this process.
func (l *live) released(id string) {
	l.adjust(id, func(in *optimistic.KeyInfo) { in.Live = max(in.Live-1, 0) })
}

func (l *live) adjust(id string, f func(*optimistic.KeyInfo)) {
	if l.maxAge <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if k, ok := l.keys[id]; ok {
		f(&k.info)
		l.keys[id] = k
	}
}
