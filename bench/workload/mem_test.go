package workload

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/credpool/credpool/optimistic"
)

// memStore is an in-memory lease store for testing the runner without a
// server: correct under its mutex, unless oversell is set, in which case it
// ignores limits. delay slows every Allocate down.
type memStore struct {
	mu       sync.Mutex
	limits   map[string]int
	leases   map[string]map[string]time.Time // key id → lease id → expiry
	next     int
	delay    time.Duration
	oversell bool
}

var _ optimistic.LeaseStore = (*memStore)(nil)

func newMemStore() *memStore {
	return &memStore{limits: map[string]int{}, leases: map[string]map[string]time.Time{}}
}

func (m *memStore) Allocate(ctx context.Context, req optimistic.AllocateRequest) (optimistic.Lease, optimistic.Stats, error) {
	time.Sleep(m.delay)
	m.mu.Lock()
	defer m.mu.Unlock()
	var st optimistic.Stats
	now := time.Now()
	for _, id := range req.Candidates {
		st.Attempts++
		for lease, until := range m.leases[id] {
			if !until.After(now) {
				delete(m.leases[id], lease)
			}
		}
		if !m.oversell && len(m.leases[id]) >= m.limits[id] {
			continue
		}
		m.next++
		lease := optimistic.Lease{
			LeaseRef: optimistic.LeaseRef{Provider: req.Provider, Pool: req.Pool, KeyID: id, LeaseID: "l" + strconv.Itoa(m.next)},
			Until:    now.Add(req.TTL),
		}
		m.leases[id][lease.LeaseID] = lease.Until
		return lease, st, nil
	}
	return optimistic.Lease{}, st, &optimistic.CapacityError{}
}

func (m *memStore) Release(_ context.Context, ref optimistic.LeaseRef) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.leases[ref.KeyID][ref.LeaseID]; !ok {
		return optimistic.ErrLeaseLost
	}
	delete(m.leases[ref.KeyID], ref.LeaseID)
	return nil
}

func (m *memStore) Holds(_ context.Context, ref optimistic.LeaseRef) (time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	until, ok := m.leases[ref.KeyID][ref.LeaseID]
	if !ok || !until.After(time.Now()) {
		return time.Time{}, optimistic.ErrLeaseLost
	}
	return until, nil
}

func (m *memStore) Renew(context.Context, optimistic.LeaseRef, time.Duration) (time.Time, error) {
	return time.Time{}, fmt.Errorf("memStore: renew is not used by the runner")
}

func (m *memStore) SyncKey(_ context.Context, k optimistic.KeyState) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.limits[k.ID] = k.MaxConcurrentUses
	if m.leases[k.ID] == nil {
		m.leases[k.ID] = map[string]time.Time{}
	}
	return nil
}

func (m *memStore) DeleteKey(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.limits, id)
	delete(m.leases, id)
	return nil
}

func (m *memStore) ClearLeases(_ context.Context, id string) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(m.leases[id])
	m.leases[id] = map[string]time.Time{}
	return n, nil
}

func (m *memStore) Inspect(_ context.Context, ids ...string) ([]optimistic.KeyInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	out := make([]optimistic.KeyInfo, len(ids))
	for i, id := range ids {
		live := 0
		for _, until := range m.leases[id] {
			if until.After(now) {
				live++
			}
		}
		_, exists := m.limits[id]
		out[i] = optimistic.KeyInfo{ID: id, Exists: exists, Limit: m.limits[id], Live: live}
	}
	return out, nil
}

func (m *memStore) Ping(context.Context) error { return nil }

// waitStore is a memStore whose callers can wait for a slot: a release
// wakes the next caller in line, as a Waiter's release in this process does.
type waitStore struct {
	*memStore
	queue optimistic.Queue
}

var _ optimistic.Waiter = (*waitStore)(nil)

func (w *waitStore) Allocate(ctx context.Context, req optimistic.AllocateRequest) (optimistic.Lease, optimistic.Stats, error) {
	if req.Wait > 0 {
		return optimistic.AllocateWaiting(ctx, w, req, w.memStore.Allocate)
	}
	return w.memStore.Allocate(ctx, req)
}

func (w *waitStore) Release(ctx context.Context, ref optimistic.LeaseRef) error {
	err := w.memStore.Release(ctx, ref)
	w.queue.Wake(ref.KeyID)
	return err
}

func (w *waitStore) Await(_ context.Context, keyIDs []string) (*optimistic.Place, error) {
	return w.queue.Join(keyIDs), nil
}

func (w *waitStore) Waiting() int { return w.queue.Len() }
