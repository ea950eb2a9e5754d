package fleet

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/workload"
)

// The unbounded oracle is a floor: no strategy's TTFT percentile goes
// below it, under load or not; the pooled oracle hits exactly the fleet's
// ceiling, and a request that finds its prefix cached costs the oracle
// only the prefill of the rest.
func TestOracleIsAFloorForEveryStrategy(t *testing.T) {
	p, err := sim.LookupProfile("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	w, err := workload.MultiTurn{Users: 40, Rounds: 4, SystemTokens: 2000, QuestionTokens: 400,
		OutputTokens: 100, Rate: 8, ThinkTime: 2 * time.Second, Seed: 5}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	floor := RunOracle(w, p, 0)
	pooled := RunOracle(w, p, 4)
	if got, want := pooled.HitRatio, Ceiling(w, p, 4); got != want {
		t.Errorf("pooled oracle hit ratio %.4f, want the ceiling %.4f", got, want)
	}
	if floor.HitRatio < pooled.HitRatio {
		t.Errorf("unbounded oracle hits %.4f, below the pooled %.4f", floor.HitRatio, pooled.HitRatio)
	}
	// Follow-up turns reuse their conversation: the oracle's median is
	// far below a cold prefill of the median prompt.
	if cold := p.PrefillTime(0, 2400); floor.TTFT.P50 >= cold/2 {
		t.Errorf("oracle TTFT p50 %v, want well below a cold 2,400-token prefill %v", floor.TTFT.P50, cold)
	}
	for _, name := range []string{"round_robin", "kv_cache_aware", "dynamo_kv"} {
		r, err := NewStrategy(name, 4, StrategyOptions{Seed: 1, Profile: p})
		if err != nil {
			t.Fatal(err)
		}
		res, err := Run(Config{Replicas: 4, Profile: p}, w, r)
		if err != nil {
			t.Fatal(err)
		}
		s := res.Summarize()
		// The run's own hits with no queueing sit between the floor and
		// the run: queueing only adds, and no run's hits beat the floor's.
		u := res.UnqueuedTTFT(p)
		if u.P90 > s.TTFT.P90 || u.P99 > s.TTFT.P99 || u.P90 < floor.TTFT.P90 || u.P99 < floor.TTFT.P99 {
			t.Errorf("%s: TTFT p90/p99 with no queueing %v/%v, want between the floor %v/%v and the run %v/%v", name, u.P90, u.P99, floor.TTFT.P90, floor.TTFT.P99, s.TTFT.P90, s.TTFT.P99)
		}
		t.Logf("%s TTFT p50/p90/p99 %v/%v/%v; floor %v/%v/%v", name, s.TTFT.P50, s.TTFT.P90, s.TTFT.P99, floor.TTFT.P50, floor.TTFT.P90, floor.TTFT.P99)
		if s.TTFT.P50 < floor.TTFT.P50 || s.TTFT.P90 < floor.TTFT.P90 || s.TTFT.P99 < floor.TTFT.P99 {
			t.Errorf("%s TTFT %v/%v/%v below the oracle floor %v/%v/%v", name, s.TTFT.P50, s.TTFT.P90, s.TTFT.P99, floor.TTFT.P50, floor.TTFT.P90, floor.TTFT.P99)
		}
	}
}
