package broker

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/credpool/credpool/optimistic"
)

// liveReadTimeout bounds one background read of the store's live state.
const liveReadTimeout = 2 * time.Second

// live is the lease store's live state of keys as this process last read
// it (Inspect), kept up by its own grants and releases since, so that
// ranking does not read the store on every allocate. A state older than
// maxAge is still used while a read of it runs in the background, up to
// liveStale times maxAge; older, it is read again before it ranks. A key
// the store passed over before the one it granted (full, or busy with
// another call) counts one slot busier; the states of the keys of an
// allocate that found none free are dropped, so the next allocate reads
// them. Ranking is all it serves: the store decides every grant on its own
// state. With maxAge zero or less it keeps nothing. It is safe for
// concurrent use.
type live struct {
	store  optimistic.LeaseStore
	maxAge time.Duration
	log    *slog.Logger

	mu     sync.Mutex
	keys   map[string]liveKey
	swept  time.Time
	closed bool
	// queue holds the ids of stale states to read, in the background, by
	// one goroutine at a time, which runs while reading is set; queued
	// has the ids in queue or being read.
	queue   []string
	queued  map[string]bool
	reading bool
	stop    context.CancelFunc // ends the reads of the goroutine last started
	done    chan struct{}      // closed when that goroutine has ended

	kept, read, background atomic.Int64 // see LiveReads
}

// LiveReads counts, since start, the keys' live states that ranked an
// allocate as kept (no read), those an allocate read from the store, and
// those read again in the background (see Options.LiveMaxAge).
type LiveReads struct {
	Kept, Read, Background int64
}

type liveKey struct {
	info optimistic.KeyInfo
	read time.Time // when the read that found info started; zero: none
	// dropped is when the state was dropped: a read that started before
	// does not bring it back.
	dropped time.Time
}

// Ages of a state, in multiples of maxAge: past liveStale it is read again
// before it ranks; past liveForget, if no allocate asked for it, it is
// dropped, so keys deleted from the catalog leave none behind.
const (
	liveStale  = 4
	liveForget = 100
)

// liveMaxAgeCap bounds maxAge where it is multiplied, against overflow.
const liveMaxAgeCap = time.Hour

func newLive(s optimistic.LeaseStore, maxAge time.Duration, log *slog.Logger) *live {
	return &live{store: s, maxAge: maxAge, log: log, keys: map[string]liveKey{}, queued: map[string]bool{}}
}

// get returns the known state of each of ids, and the indexes of those
// with none (or one older than liveStale times maxAge), which the caller
// reads from the store and puts. A state older than maxAge is returned and
// read again in the background.
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
		age := now.Sub(k.read)
		if !ok || k.read.IsZero() || age > l.age(liveStale) {
			missing = append(missing, i)
			continue
		}
		infos[i] = k.info
		if age > l.maxAge && !l.queued[id] {
			l.queued[id] = true
			l.queue = append(l.queue, id)
		}
	}
	l.kept.Add(int64(len(ids) - len(missing)))
	if !l.reading && !l.closed && len(l.queue) > 0 {
		l.reading = true
		ctx, cancel := context.WithCancel(context.Background())
		l.stop, l.done = cancel, make(chan struct{})
		go l.refresh(ctx, cancel, l.done)
	}
	return infos, missing
}

// reads returns the counts.
func (l *live) reads() LiveReads {
	return LiveReads{Kept: l.kept.Load(), Read: l.read.Load(), Background: l.background.Load()}
}

// readNow keeps, and counts, states an allocate read from the store by a
// read that started at read.
func (l *live) readNow(infos []optimistic.KeyInfo, read time.Time) {
	l.read.Add(int64(len(infos)))
	l.put(infos, read)
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
		if k, ok := l.keys[in.ID]; !ok || (!k.read.After(read) && !k.dropped.After(read)) {
			l.keys[in.ID] = liveKey{info: in, read: read}
		}
	}
	l.sweep(read)
}

// sweep drops, at most once per forget period, the states not read for
// that long.
func (l *live) sweep(now time.Time) {
	forget := l.age(liveForget)
	if now.Sub(l.swept) < forget {
		return
	}
	l.swept = now
	for id, k := range l.keys {
		if now.Sub(later(k.read, k.dropped)) > forget && !l.queued[id] {
			delete(l.keys, id)
		}
	}
}

// age is n times maxAge.
func (l *live) age(n int) time.Duration { return time.Duration(n) * min(l.maxAge, liveMaxAgeCap) }

// close starts no more reads in the background, ends the one under way
// and waits for it, or for ctx, whichever ends first: the store may be
// closed next.
func (l *live) close(ctx context.Context) {
	l.mu.Lock()
	l.closed = true
	stop, done := l.stop, l.done
	l.mu.Unlock()
	if stop == nil {
		return
	}
	stop()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// refresh reads the queued states until none is left or ctx ends, then
// cancels ctx and closes done.
func (l *live) refresh(ctx context.Context, cancel context.CancelFunc, done chan<- struct{}) {
	defer close(done)
	defer cancel()
	for {
		l.mu.Lock()
		ids := l.queue
		l.queue = nil
		if l.closed {
			for _, id := range ids {
				delete(l.queued, id)
			}
			ids = nil
		}
		l.reading = len(ids) > 0
		l.mu.Unlock()
		if len(ids) == 0 {
			return
		}
		rctx, rcancel := context.WithTimeout(ctx, liveReadTimeout)
		read := time.Now()
		infos, err := l.store.Inspect(rctx, ids...)
		rcancel()
		if err != nil {
			// The next allocate that wants them reads them itself.
			l.log.Debug("read live state of keys", "keys", len(ids), "err", err)
			l.drop(ids...)
		} else {
			l.background.Add(int64(len(ids)))
			l.put(infos, read)
		}
		l.mu.Lock()
		for _, id := range ids {
			delete(l.queued, id)
		}
		l.mu.Unlock()
	}
}

// drop forgets the kept states of ids, and any read of them that started
// before: the store did not find them as kept. A key with no state, and
// none being read in the background, is left alone: a full pool's answer
// costs the keys it ranked on, not every key of the pool (an allocate's
// own read of such a key, started before, may then still keep what it
// found, for ranking only, until it is stale).
func (l *live) drop(ids ...string) {
	if l.maxAge <= 0 {
		return
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if _, ok := l.keys[id]; ok || l.queued[id] {
			l.keys[id] = liveKey{dropped: now}
		}
	}
}

// busier notes that the store passed over keys ids: full, or busy with
// another call (its gate, a lost race), so one slot busier than known, up
// to full.
func (l *live) busier(ids ...string) {
	for _, id := range ids {
		l.adjust(id, func(in *optimistic.KeyInfo) { in.Live = min(in.Live+1, max(in.Limit, in.Live)) })
	}
}

// granted notes a grant of key id at at by this process, which proves a
// slot was free.
func (l *live) granted(id string, at time.Time) {
	l.adjust(id, func(in *optimistic.KeyInfo) {
		if in.Exists {
			in.Live = min(in.Live, in.Limit-1) + 1
			in.LastUsedAt = later(in.LastUsedAt, at)
		}
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
	if k, ok := l.keys[id]; ok && !k.read.IsZero() {
		f(&k.info)
		l.keys[id] = k
	}
}
