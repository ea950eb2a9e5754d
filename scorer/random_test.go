package scorer

import (
	"math"
	"testing"
)

// Ties are broken uniformly: every candidate tied with the best
// (within scoreEpsilon) is the primary about equally often, wherever it
// stands in the candidate order, and nobody else ever is.
func TestTiesBrokenUniformly(t *testing.T) {
	for _, scores := range [][]float64{
		{0.9, 0.2, 0.9, 0.9 + scoreEpsilon/2, 0.5, 0.9, 0.1},
		{0.1, 0.5, 0.9, 0.9, 0.9, 0.2, 0.9},
		{math.Inf(-1), math.Inf(-1), math.Inf(-1), math.Inf(-1)},
	} {
		const n = 40000
		var tied []int
		for h, v := range scores {
			if v >= 0.9 || math.IsInf(v, -1) {
				tied = append(tied, h)
			}
		}
		s := NewScratch(11)
		c := &Cycle{MaxPicks: 1, Rand: s.rng}
		count := make([]int, len(scores))
		for range n {
			count[(&maxScorePicker{}).Pick(c, all(len(scores)), scores, nil)[0]]++
		}
		// Binomial(n, 1/k): a standard deviation below 100 for n = 40000.
		want := n / len(tied)
		for h := range scores {
			exp := 0
			for _, x := range tied {
				if x == h {
					exp = want
				}
			}
			if count[h] < exp-500 || count[h] > exp+500 {
				t.Fatalf("scores %v: primaries %v, want about %d for each of %v", scores, count, want, tied)
			}
		}
	}
}
