package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/credpool/credpool/bench/report"
	"github.com/credpool/credpool/optimistic"
)

// sampleEvery is how often the audit reads the store's state during a run
// whose callers hold for zero (see sampler).
const sampleEvery = 20 * time.Millisecond

// readLive reads the state of keys, as LeaseStore.Inspect does.
type readLive func(ctx context.Context, keyIDs ...string) ([]optimistic.KeyInfo, error)

// sampler is the audit's reading of the store's own state during a run
// whose callers hold for zero. A lease then lives from its grant's commit
// to its release's, but the harness counts its holder only from the
// grant's answer to the release's request: its count of holders would see
// two leases overlap only by chance, and the check after the run finds
// every lease released. So every sampleEvery it reads the live leases of
// up to batch keys, the next ones in turn, and notes every key over its
// limit, or missing, as a state violation. Only reads that answered count
// as samples (the run's own calls count store errors).
type sampler struct {
	cancel context.CancelFunc
	done   chan report.Audit
	once   sync.Once
	found  report.Audit
}

// sample starts a sampler of ids, of limit, through read, batch keys a
// read.
func sample(ctx context.Context, read readLive, ids []string, limit, batch int) *sampler {
	ctx, cancel := context.WithCancel(ctx)
	sm := &sampler{cancel: cancel, done: make(chan report.Audit, 1)}
	go func() {
		var a report.Audit
		tick := time.NewTicker(sampleEvery)
		defer tick.Stop()
		for next := 0; ; {
			select {
			case <-ctx.Done():
				sm.done <- a
				return
			case <-tick.C:
			}
			end := min(next+batch, len(ids))
			infos, err := read(ctx, ids[next:end]...)
			if err == nil {
				checkLive(infos, limit, "during the run", &a)
				a.Samples++
			}
			if next = end; next == len(ids) {
				next = 0
			}
		}
	}()
	return sm
}

// stop ends the sampling, if not yet, and returns what it found.
func (sm *sampler) stop() report.Audit {
	sm.once.Do(func() {
		sm.cancel()
		sm.found = <-sm.done
	})
	return sm.found
}

// checkLive notes in a every key of infos over limit, or missing, as a
// state violation found when.
func checkLive(infos []optimistic.KeyInfo, limit int, when string, a *report.Audit) {
	for _, in := range infos {
		var bad string
		switch {
		case !in.Exists:
			bad = fmt.Sprintf("key %s is missing from the store %s", in.ID, when)
		case in.Live > limit:
			bad = fmt.Sprintf("key %s has %d live leases in the store %s, limit %d", in.ID, in.Live, when, limit)
		}
		if bad != "" {
			a.StateViolations++
			if a.First == "" {
				a.First = bad
			}
		}
	}
}
