package workload

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// Gray et al.'s method is exact for ranks 0 and 1 and approximate beyond;
// YCSB accepts the same. The seed is fixed, so the test is deterministic.
func TestZipfianMatchesZipfLaw(t *testing.T) {
	for _, tc := range []struct {
		n     int
		theta float64
	}{{1000, 0.99}, {100, 0.5}, {10, 0.99}} {
		z := NewZipfian(tc.n, tc.theta)
		rng := rand.New(rand.NewPCG(1, 2))
		const draws = 200_000
		counts := make([]int, tc.n)
		for range draws {
			i := z.Next(rng)
			require.True(t, i >= 0 && i < tc.n, "rank %d out of [0,%d)", i, tc.n)
			counts[i]++
		}
		freq := func(i int) float64 { return float64(counts[i]) / draws }
		for i := range min(tc.n, 20) {
			tol := 0.25 // the continuous approximation, near the head
			if i < 2 {
				tol = 0.05 // exact ranks: sampling noise only
			}
			require.InEpsilon(t, zipfProbability(z, i), freq(i), tol, "n=%d θ=%g rank %d", tc.n, tc.theta, i)
		}
		var head, want float64
		for i := range tc.n / 10 {
			head += freq(i)
			want += zipfProbability(z, i)
		}
		require.InDelta(t, want, head, 0.03, "n=%d θ=%g: mass of the top tenth", tc.n, tc.theta)
	}
}

func TestZipfianOneAndTwoItems(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	one := NewZipfian(1, ZipfTheta)
	for range 1000 {
		require.Zero(t, one.Next(rng))
	}
	two := NewZipfian(2, ZipfTheta)
	var ones int
	for range 10_000 {
		ones += two.Next(rng)
	}
	require.InEpsilon(t, zipfProbability(two, 1), float64(ones)/10_000, 0.1)
}

// zipfProbability is the exact Zipf probability of rank i, which Next
// approximates.
func zipfProbability(z *Zipfian, i int) float64 {
	return 1 / (math.Pow(float64(i+1), z.theta) * z.zetan)
}
