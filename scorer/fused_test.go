package scorer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/kvroute/kvroute/config"
)

// appendByScore's one pass picks what repeated selection picks: by score,
// ties in candidate order, NaN and -Inf never, hosts already in order never.
func TestAppendByScoreMatchesSelection(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	vals := []float64{0, 0.25, 0.5, 0.5, 1, math.NaN(), math.Inf(-1), math.Inf(1), -2}
	for iter := 0; iter < 20000; iter++ {
		n := 1 + rng.IntN(20)
		scores := make([]float64, n)
		for i := range scores {
			if rng.IntN(2) == 0 {
				scores[i] = vals[rng.IntN(len(vals))]
			} else {
				scores[i] = rng.Float64()
			}
		}
		cand := rng.Perm(n)[:1+rng.IntN(n)]
		var order []int
		for k := rng.IntN(3); k > 0; k-- {
			order = append(order, cand[rng.IntN(len(cand))])
		}
		max := rng.IntN(12)
		want := appendByScoreSlow(append([]int(nil), order...), cand, scores, max)
		got := appendByScore(append([]int(nil), order...), cand, scores, max)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("scores %v cand %v order %v max %d: got %v, want %v", scores, cand, order, max, got, want)
		}
	}
}

// maxScorePicker.Pick picks what argmaxRandomTie then appendByScore pick, and
// draws exactly the same random numbers (the seeded simulator depends on it).
func TestMaxScorePickMatchesTwoPasses(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	vals := []float64{0, 0.5, 0.5, 0.5 + scoreEpsilon/2, 1, math.NaN(), math.Inf(-1), -1}
	for iter := 0; iter < 20000; iter++ {
		n := 1 + rng.IntN(20)
		scores := make([]float64, n)
		for i := range scores {
			if rng.IntN(3) > 0 {
				scores[i] = vals[rng.IntN(len(vals))]
			} else {
				scores[i] = rng.Float64()
			}
		}
		cand := rng.Perm(n)[:1+rng.IntN(n)]
		maxPicks := 1 + rng.IntN(10)
		seed := rng.Uint64()
		ra, rb := rand.New(rand.NewPCG(seed, 1)), rand.New(rand.NewPCG(seed, 1))
		ca := &Cycle{MaxPicks: maxPicks, Rand: ra}
		cb := &Cycle{MaxPicks: maxPicks, Rand: rb}
		want := appendByScore([]int{argmaxRandomTie(ca, cand, scores)}, cand, scores, maxPicks)
		got := (&maxScorePicker{}).Pick(cb, cand, scores, nil)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("scores %v cand %v max %d: got %v, want %v", scores, cand, maxPicks, got, want)
		}
		if ra.Uint64() != rb.Uint64() {
			t.Fatalf("scores %v cand %v: different random draws", scores, cand)
		}
	}
}

// Each load scorer reads its own host figure (a switch, not a closure).
func TestLoadScorersReadTheirFigure(t *testing.T) {
	hosts := fleet(4)
	// Host i is the least loaded by figure i alone.
	for i := range hosts {
		h := &hosts[i]
		h.Waiting, h.Running, h.InFlight = 5, 5, 5
		h.PendingPrefillTokens, h.PendingDecodeTokens = 500, 500
	}
	hosts[0].Waiting = 1
	hosts[1].Running = 1
	hosts[2].InFlight = 1
	hosts[3].PendingPrefillTokens = 100
	c := &Cycle{Req: newReq(4, 100, 1), Hosts: hosts, s: &Scratch{}}
	for want, typ := range []string{"queue", "running", "least_request", "pending_tokens"} {
		errs := &config.Errors{}
		sc := registry[typ].new(config.NewParams("test", map[string]gjson.Result{}, errs)).(Scorer)
		out := make([]float64, 4)
		sc.Score(c, []int{0, 1, 2, 3}, out)
		for h, v := range out {
			if (v == 1) != (h == want) {
				t.Fatalf("%s: scores %v, want only host %d at 1", typ, out, want)
			}
		}
	}
	// pending_tokens weighs decode tokens by decodeWeight.
	errs := &config.Errors{}
	sc := registry["pending_tokens"].new(config.NewParams("test", map[string]gjson.Result{"decodeWeight": gjson.Parse("2")}, errs)).(loadScorer)
	if got := sc.load(&Host{PendingPrefillTokens: 10, PendingDecodeTokens: 3}); got != 16 {
		t.Fatalf("pending_tokens load with decodeWeight 2: %v, want 16", got)
	}
}
