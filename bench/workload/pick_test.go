package workload

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPickerCandidates(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec Spec
		// check inspects one list of candidates.
		check func(t *testing.T, ids []string)
	}{
		{"uniform", Spec{Keys: 50, Candidates: 4, Choice: Uniform, Order: Ranked}, nil},
		{"zipf over as many keys as candidates", Spec{Keys: 4, Candidates: 4, Choice: Zipf, Order: Ranked}, nil},
		{"hot key first", Spec{Keys: 10, Candidates: 3, Choice: Hot, Order: Ranked}, func(t *testing.T, ids []string) {
			require.Equal(t, "k0", ids[0])
		}},
		{"identical order", Spec{Keys: 8, Candidates: 5, Choice: Zipf, Order: Identical}, func(t *testing.T, ids []string) {
			require.Equal(t, []string{"k0", "k1", "k2", "k3", "k4"}, ids)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var zipf *Zipfian
			if tc.spec.Choice == Zipf {
				zipf = NewZipfian(tc.spec.Keys, ZipfTheta)
			}
			p := newPicker(tc.spec, zipf, rand.New(rand.NewPCG(5, 6)))
			firsts := map[string]bool{}
			for range 500 {
				ids := p.candidates()
				require.Len(t, ids, tc.spec.Candidates)
				sorted := slices.Clone(ids)
				slices.Sort(sorted)
				require.Len(t, slices.Compact(sorted), tc.spec.Candidates, "distinct: %v", ids)
				if tc.check != nil {
					tc.check(t, ids)
				}
				firsts[ids[0]] = true
			}
			if tc.spec.Order == Ranked && tc.spec.Choice != Hot {
				require.Greater(t, len(firsts), 1, "callers rank differently")
			}
		})
	}
}

func TestPickerHoldAndPause(t *testing.T) {
	s := Spec{Keys: 1, Candidates: 1, Choice: Uniform, Order: Ranked, Hold: 1000, HoldDist: Fixed, Pause: 1000}
	p := newPicker(s, nil, rand.New(rand.NewPCG(7, 8)))
	require.Equal(t, s.Hold, p.hold())
	var sum float64
	for range 10_000 {
		d := p.pause()
		require.True(t, d >= 500 && d < 1500, "pause %v outside ±50%%", d)
	}
	s.HoldDist = Exponential
	p = newPicker(s, nil, rand.New(rand.NewPCG(7, 8)))
	for range 10_000 {
		sum += float64(p.hold())
	}
	require.InEpsilon(t, 1000, sum/10_000, 0.05, "exponential hold keeps its mean")
}
