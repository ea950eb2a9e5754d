package fleet

import (
	"os"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/workload"
)

// On a fleet mixing H100 and A100 replicas (3.1x the prefill time), the
// default profile with its token cost replaced by the learned predicted
// TTFT (testdata/bench/kv_cache_aware_predicted_ttft.json) has a lower
// tail TTFT than the default, which prices a token alike everywhere.
func TestPredictedTTFTBeatsStaticCostOnMixedFleet(t *testing.T) {
	h100, _ := sim.LookupProfile("llama3-8b-h100")
	a100, err := sim.LookupProfile("llama3-8b-a100")
	if err != nil {
		t.Fatal(err)
	}
	w, err := workload.MultiTurn{Users: 100, Rounds: 6, SystemTokens: 1000, QuestionTokens: 300,
		OutputTokens: 200, Rate: 2, ThinkTime: 5 * time.Second, Seed: 3}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile("../../../testdata/bench/kv_cache_aware_predicted_ttft.json")
	if err != nil {
		t.Fatal(err)
	}
	run := func(name string) (Summary, *RealRouter) {
		r, err := NewStrategy(name, 8, StrategyOptions{Seed: 1, Profile: h100, Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		res, err := Run(Config{Replicas: 8, Profile: h100, Mixed: []sim.Profile{h100, a100}}, w, r)
		if err != nil {
			t.Fatal(err)
		}
		return res.Summarize(), r.(*RealRouter)
	}
	static, _ := run("kv_cache_aware")
	learned, rr := run("kv_cache_aware_predicted_ttft")
	t.Logf("TTFT p90/p99: static cost %v/%v, predicted TTFT %v/%v", static.TTFT.P90, static.TTFT.P99, learned.TTFT.P90, learned.TTFT.P99)
	if learned.TTFT.P90 >= static.TTFT.P90 || learned.TTFT.P99 >= static.TTFT.P99 {
		t.Errorf("predicted TTFT p90/p99 %v/%v, want below the static cost's %v/%v", learned.TTFT.P90, learned.TTFT.P99, static.TTFT.P90, static.TTFT.P99)
	}
	// What the router learned: the A100s (odd replicas) cost more per token.
	hosts := append(rr.hosts[:0:0], rr.hosts...)
	if !rr.r.TTFTModels(hosts) {
		t.Fatal("the predicted_ttft profile learns no model")
	}
	var fast, slow float64
	for i, h := range hosts {
		if i%2 == 0 {
			fast += h.TTFTMsPerToken
		} else {
			slow += h.TTFTMsPerToken
		}
	}
	if !(slow > 1.5*fast) {
		t.Errorf("learned ms/token: H100s %.4f, A100s %.4f (sums), want the A100s well above", fast, slow)
	}
}
