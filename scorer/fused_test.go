package scorer

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// randomCase is a fleet and request with the awkward values a scorer must
// survive: stale hosts, utilisation outside [0, 1], matches longer than the
// prompt or negative, empty prompts, ties, pins to a host or to nobody.
func randomCase(rng *rand.Rand, n int) ([]Host, *Request) {
	hosts, req := benchFleet(n)
	for i := range hosts {
		h := &hosts[i]
		h.Stale = rng.IntN(6) == 0
		switch rng.IntN(8) {
		case 0:
			h.KVUsage = 1.5
		case 1:
			h.KVUsage = -0.25
		case 2:
			h.KVUsage = 0.5 // ties
		}
		if rng.IntN(3) == 0 { // idle: ties in every load figure
			h.Waiting, h.Running, h.InFlight = 0, 0, 0
			h.PendingPrefillTokens, h.PendingDecodeTokens = 0, 0
		}
		switch rng.IntN(10) {
		case 0:
			req.MatchedBlocks[i], req.MatchedTokens[i] = 50, 20000
		case 1:
			req.MatchedBlocks[i], req.MatchedTokens[i] = -3, -700
		}
	}
	switch rng.IntN(6) {
	case 0:
		req.PromptTokens, req.TotalBlocks = 0, 0
	case 1:
		req.PromptTokens = 10
	}
	if rng.IntN(2) == 0 {
		req.PinnedAddress = hosts[rng.IntN(n)].Address
	}
	if rng.IntN(2) == 0 {
		req.PrefixAddress = hosts[rng.IntN(n)].Address
	}
	if rng.IntN(3) == 0 {
		req.MatchedBlocks, req.MatchedTokens = req.MatchedBlocks[:n/2], req.MatchedTokens[:n/2]
	}
	return hosts, req
}

// Every built-in scoreAdd computes what Score followed by Run's clamp,
// weighted sum and normalisation computes, bit for bit, raw scores and
// totals alike.
func TestScoreAddMatchesScore(t *testing.T) {
	cases := []struct {
		typ, params string
	}{
		{"prefix_cache", `{}`}, {"prefix_cache", `{"unit": "blocks"}`}, {"prefix_cache", `{"scaleTokens": 8192}`},
		{"prefill_cost", `{}`}, {"prefill_cost", `{"scaleTokens": 16384}`}, {"prefill_cost", `{"decodeWeight": 0}`},
		{"kv_utilization", `{}`}, {"queue", `{}`}, {"running", `{}`}, {"least_request", `{}`},
		{"pending_tokens", `{}`}, {"session_affinity", `{}`}, {"prefix_memory", `{}`},
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for _, tc := range cases {
		t.Run(tc.typ+tc.params, func(t *testing.T) {
			var m map[string]json.RawMessage
			if err := json.Unmarshal([]byte(tc.params), &m); err != nil {
				t.Fatal(err)
			}
			errs := &errList{}
			p := registry[tc.typ].new(newParams("test", m, errs))
			if err := errs.err(); err != nil {
				t.Fatal(err)
			}
			sc := p.(Scorer)
			ad, ok := p.(scoreAdder)
			if !ok {
				t.Fatalf("%s has no scoreAdd", tc.typ)
			}
			for iter := 0; iter < 300; iter++ {
				n := 1 + rng.IntN(24)
				hosts, req := randomCase(rng, n)
				cand := rng.Perm(n)[:1+rng.IntN(n)]
				w := []float64{1, 3, 1.5, 0.1}[rng.IntN(4)]
				scale := []float64{0, 0, 1 / 10.5, 1 / 7.0}[rng.IntN(4)]
				c := &Cycle{Req: req, Hosts: hosts, MaxPicks: 3, s: &Scratch{}}
				want, wantTotal := make([]float64, n), make([]float64, n)
				got, gotTotal := make([]float64, n), make([]float64, n)
				for i := range wantTotal {
					wantTotal[i] = float64(i) / 7 // an earlier scorer's sum
					gotTotal[i] = wantTotal[i]
				}
				sc.Score(c, cand, want)
				for _, h := range cand {
					v := want[h]
					if v != v || v < 0 {
						v = 0
					} else if v > 1 {
						v = 1
					}
					want[h] = v
					wantTotal[h] += w * v
					if scale != 0 { // Run's normalisation pass
						wantTotal[h] *= scale
					}
				}
				ad.scoreAdd(c, cand, got, gotTotal, w, scale)
				for _, h := range cand {
					if math.Float64bits(got[h]) != math.Float64bits(want[h]) || math.Float64bits(gotTotal[h]) != math.Float64bits(wantTotal[h]) {
						t.Fatalf("iteration %d host %d: scoreAdd %v (total %v), Score %v (total %v)", iter, h, got[h], gotTotal[h], want[h], wantTotal[h])
					}
				}
			}
		})
	}
}

// A preset decides the same with its scorers' scoreAdd as without (Run's own
// clamp-and-sum pass), random draws included.
func TestPresetsSameWithoutScoreAdd(t *testing.T) {
	for _, name := range PresetNames() {
		t.Run(name, func(t *testing.T) {
			fused := handler(t, name)
			plain := handler(t, name)
			prof := *plain.Decode
			prof.Scorers = append([]WeightedScorer(nil), prof.Scorers...)
			for i := range prof.Scorers {
				prof.Scorers[i].adder = nil
			}
			plain.Decode = &prof
			sf, sp := NewScratch(3), NewScratch(3)
			rng := rand.New(rand.NewPCG(11, 11))
			for iter := 0; iter < 500; iter++ {
				hosts, req := randomCase(rng, 1+rng.IntN(20))
				a, b := fused.Run(req, hosts, sf), plain.Run(req, hosts, sp)
				if fmt.Sprint(a.Decode.Order) != fmt.Sprint(b.Decode.Order) {
					t.Fatalf("iteration %d: order %v with scoreAdd, %v without", iter, a.Decode.Order, b.Decode.Order)
				}
				for h := range hosts {
					if math.Float64bits(a.Decode.Total[h]) != math.Float64bits(b.Decode.Total[h]) {
						t.Fatalf("iteration %d host %d: total %v with scoreAdd, %v without", iter, h, a.Decode.Total[h], b.Decode.Total[h])
					}
					for i := range fused.Decode.Scorers {
						if x, y := a.Decode.ScorerScore(i, h), b.Decode.ScorerScore(i, h); math.Float64bits(x) != math.Float64bits(y) && a.Decode.Survivors > 0 {
							// Only survivors' scores are defined.
							for _, o := range a.Decode.Order {
								if o == h {
									t.Fatalf("iteration %d host %d scorer %d: %v with scoreAdd, %v without", iter, h, i, x, y)
								}
							}
						}
					}
				}
			}
		})
	}
}

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

// pickBestRandomTie picks what argmaxRandomTie then appendByScore pick, and
// draws exactly the same random numbers (the seeded simulator depends on it).
func TestPickBestRandomTieMatchesTwoPasses(t *testing.T) {
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
		got := pickBestRandomTie(cb, cand, scores, nil)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("scores %v cand %v max %d: got %v, want %v", scores, cand, maxPicks, got, want)
		}
		if ra.Uint64() != rb.Uint64() {
			t.Fatalf("scores %v cand %v: different random draws", scores, cand)
		}
	}
}

// Each load scorer reads its own host figure (a switch now, not a closure).
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
		errs := &errList{}
		sc := registry[typ].new(newParams("test", map[string]json.RawMessage{}, errs)).(Scorer)
		out := make([]float64, 4)
		sc.Score(c, []int{0, 1, 2, 3}, out)
		for h, v := range out {
			if (v == 1) != (h == want) {
				t.Fatalf("%s: scores %v, want only host %d at 1", typ, out, want)
			}
		}
	}
	// pending_tokens weighs decode tokens by decodeWeight.
	errs := &errList{}
	sc := registry["pending_tokens"].new(newParams("test", map[string]json.RawMessage{"decodeWeight": json.RawMessage("2")}, errs)).(loadScorer)
	if got := sc.load(&Host{PendingPrefillTokens: 10, PendingDecodeTokens: 3}); got != 16 {
		t.Fatalf("pending_tokens load with decodeWeight 2: %v, want 16", got)
	}
}
