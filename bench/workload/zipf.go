package workload

import (
	"math"
	"math/rand/v2"
)

// Zipfian draws integers in [0, n), i with probability close to
// 1/((i+1)^θ · ζ(n,θ)), by the method of Gray et al. ("Quickly generating
// billion-record synthetic databases", SIGMOD 1994) that YCSB's
// ZipfianGenerator uses. Unlike math/rand's Zipf it accepts θ < 1, which
// YCSB's 0.99 needs. Ranks 0 and 1 are exact; the rest follow a continuous
// approximation. A Zipfian is immutable and safe for concurrent use; the
// randomness comes from the caller's source.
type Zipfian struct {
	n            int
	theta, alpha float64
	zetan, eta   float64
	secondCutoff float64 // 1 + 0.5^θ: u·ζ(n) below it draws rank 1
}

// NewZipfian prepares a generator over n ≥ 1 items with skew 0 < θ < 1.
// It sums n terms once.
func NewZipfian(n int, theta float64) *Zipfian {
	zetan := zeta(n, theta)
	return &Zipfian{
		n:            n,
		theta:        theta,
		alpha:        1 / (1 - theta),
		zetan:        zetan,
		eta:          (1 - math.Pow(2/float64(n), 1-theta)) / (1 - zeta(2, theta)/zetan),
		secondCutoff: 1 + math.Pow(0.5, theta),
	}
}

// zeta is ζ(n,θ) = Σ_{i=1..n} 1/i^θ.
func zeta(n int, theta float64) float64 {
	var sum float64
	for i := 1; i <= n; i++ {
		sum += 1 / math.Pow(float64(i), theta)
	}
	return sum
}

// Next draws a rank; 0 is the most likely.
func (z *Zipfian) Next(rng *rand.Rand) int {
	u := rng.Float64()
	uz := u * z.zetan
	switch {
	case uz < 1:
		return 0
	case uz < z.secondCutoff:
		return 1
	}
	i := int(float64(z.n) * math.Pow(z.eta*u-z.eta+1, z.alpha))
	return min(i, z.n-1)
}
