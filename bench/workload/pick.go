package workload

import (
	"math/rand/v2"
	"slices"
	"time"
)

// maxRedraws bounds the draws spent looking for distinct candidates; a
// skewed distribution over few keys can keep drawing the same one.
const maxRedraws = 64

// picker builds one caller's candidate lists. It is used by one goroutine.
type picker struct {
	spec  Spec
	rng   *rand.Rand
	zipf  *Zipfian // shared, immutable
	fixed []string // the Identical list
	buf   []int
}

func newPicker(spec Spec, zipf *Zipfian, rng *rand.Rand) *picker {
	p := &picker{spec: spec, rng: rng, zipf: zipf, buf: make([]int, 0, spec.Candidates)}
	if spec.Order == Identical {
		p.fixed = spec.KeyIDs()[:spec.Candidates]
	}
	return p
}

// draw returns one key index from the key choice; first says whether it is
// the list's first candidate.
func (p *picker) draw(first bool) int {
	switch p.spec.Choice {
	case Zipf:
		return p.zipf.Next(p.rng)
	case Hot:
		if first {
			return 0
		}
	}
	return p.rng.IntN(p.spec.Keys)
}

// candidates returns a fresh list of distinct key ids, best first. The
// store may keep it; the picker never touches it again.
func (p *picker) candidates() []string {
	if p.fixed != nil {
		return slices.Clone(p.fixed)
	}
	p.buf = p.buf[:0]
	for tries := 0; len(p.buf) < p.spec.Candidates; tries++ {
		i := p.draw(len(p.buf) == 0)
		if tries >= maxRedraws {
			// Give up on the distribution; any unused key will do.
			i = p.rng.IntN(p.spec.Keys)
		}
		if !slices.Contains(p.buf, i) {
			p.buf = append(p.buf, i)
		}
	}
	ids := make([]string, len(p.buf))
	for j, i := range p.buf {
		ids[j] = KeyID(i)
	}
	return ids
}

// hold draws one hold time.
func (p *picker) hold() time.Duration {
	if p.spec.HoldDist == Exponential {
		return time.Duration(p.rng.ExpFloat64() * float64(p.spec.Hold))
	}
	return p.spec.Hold
}

// pause draws one pause after an unsuccessful call: Pause ±50%.
func (p *picker) pause() time.Duration {
	return time.Duration((0.5 + p.rng.Float64()) * float64(p.spec.Pause))
}
