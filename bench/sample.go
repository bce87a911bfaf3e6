package bench

import (
	"context"
	"fmt"
	"slices"
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
// grant's answer to the release's request, a few microseconds: its count
// of holders would see two leases overlap only by chance, and the check
// after the run finds every lease released. So every sampleEvery until
// stopped it reads the keys' live leases (in batches of inspectBatch) and
// notes every key over its limit, or missing, as a state violation. A
// read that fails is not one (the run's own calls count store errors);
// the samples taken are counted.
type sampler struct {
	cancel context.CancelFunc
	done   chan report.Audit
	once   sync.Once
	found  report.Audit
}

// sample starts a sampler of ids, of limit, through read.
func sample(ctx context.Context, read readLive, ids []string, limit int) *sampler {
	ctx, cancel := context.WithCancel(ctx)
	sm := &sampler{cancel: cancel, done: make(chan report.Audit, 1)}
	go func() {
		var a report.Audit
		tick := time.NewTicker(sampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				sm.done <- a
				return
			case <-tick.C:
			}
			for batch := range slices.Chunk(ids, inspectBatch) {
				infos, err := read(ctx, batch...)
				if err != nil {
					break
				}
				checkLive(infos, limit, "during the run", &a)
			}
			a.Samples++
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
