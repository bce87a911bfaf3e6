package broker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/credpool/credpool/internal/catalog"
	"github.com/credpool/credpool/optimistic"
)

// DefaultMaxLease is the longest lease the service grants or renews to when
// Options.MaxLease is not set.
const DefaultMaxLease = time.Hour

// Losses counts the keys found lost from the lease store and held back,
// for the metrics and /readyz. It is safe for concurrent use; a Broker and
// its Admin share one.
type Losses struct {
	mu    sync.Mutex
	total int64
	held  map[string]time.Time // key id → end of its quarantine
}

// NewLosses returns an empty tracker.
func NewLosses() *Losses { return &Losses{held: map[string]time.Time{}} }

// LossReport is what Losses knows at one moment.
type LossReport struct {
	// Held is the number of keys held back now; Until is when the last of
	// them takes leases again.
	Held  int
	Until time.Time
	// Total counts the keys found lost since start.
	Total int64
}

func (l *Losses) add(keyID string, until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total++
	l.held[keyID] = until
}

// Report says what is held back at now, forgetting what no longer is.
func (l *Losses) Report(now time.Time) LossReport {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := LossReport{Total: l.total}
	for id, until := range l.held {
		if !until.After(now) {
			delete(l.held, id)
			continue
		}
		r.Held++
		if until.After(r.Until) {
			r.Until = until
		}
	}
	return r
}

// syncCatalog is what syncing a key needs from the catalog.
type syncCatalog interface {
	MarkSynced(ctx context.Context, id string, at time.Time) error
	Quarantine(ctx context.Context, id string, until, now time.Time) (catalog.Key, error)
}

// syncer brings a key's state from the catalog into the store, and tells a
// key the store lost from one it never had. The Broker and the Admin share
// it.
type syncer struct {
	catalog  syncCatalog
	store    optimistic.LeaseStore
	losses   *Losses
	maxLease time.Duration
	log      *slog.Logger
}

// sync writes k, as the catalog has it, into the store, whose view of it is
// in (read before k). If the store lacks a key it had (k.SyncedAt is set),
// it lost state:
// leases it forgot may still be in use for up to maxLease, so the key is
// quarantined (a cooldown until then, in the catalog and the store) rather
// than handed out again at once. It returns the key as synced and whether
// it was quarantined.
func (s syncer) sync(ctx context.Context, k catalog.Key, in optimistic.KeyInfo) (catalog.Key, bool, error) {
	lost := !in.Exists && !k.SyncedAt.IsZero()
	if lost {
		// in may predate k: another broker may have synced the key since
		// (it syncs before it marks the key synced, so a store read after k
		// sees that sync). Only a store that still lacks it lost it.
		infos, err := s.store.Inspect(ctx, k.ID)
		if err != nil {
			return k, false, err
		}
		lost = !infos[0].Exists
	}
	now := time.Now()
	if lost {
		q, err := s.catalog.Quarantine(ctx, k.ID, now.Add(s.maxLease), now)
		if err != nil {
			return k, false, catalogErr(ctx, "quarantine", err)
		}
		q.Secret = k.Secret
		k = q
	}
	if err := s.store.SyncKey(ctx, k.LeaseState()); err != nil {
		return k, false, err
	}
	if lost {
		s.losses.add(k.ID, k.CooldownUntil)
		s.log.WarnContext(ctx, "the lease store lost this key's state: no grants on it until every lease it may have had has ended",
			"key_id", k.ID, "until", k.CooldownUntil)
		return k, true, nil
	}
	if k.SyncedAt.IsZero() {
		err := s.catalog.MarkSynced(ctx, k.ID, now)
		if err != nil && !errors.Is(err, catalog.ErrNotFound) {
			return k, false, catalogErr(ctx, "mark synced", err)
		}
		k.SyncedAt = now
	}
	return k, false, nil
}
