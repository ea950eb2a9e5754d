package fleet

import (
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/workload"
)

// evictingFleet is a shared-prefix workload with a profile whose engines
// evict constantly: 2,500 KV blocks (40,000 tokens) a replica hold a
// handful of the workload's 40 system prompts.
func evictingFleet(t *testing.T) (*workload.Workload, sim.Profile) {
	t.Helper()
	w, err := workload.SharedPrefix{Groups: 40, PromptsPerGroup: 12, SystemTokens: 3000, QuestionTokens: 300,
		OutputTokens: 20, Rate: 8, Seed: 3}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	prof, err := sim.LookupProfile(sim.DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	prof.NumGPUBlocksOverride = 2500
	return w, prof
}

// TestPreciseCacheState runs kvroute's default strategy on a fleet whose
// engines evict constantly, once with approximate cache state and once
// with the engines' KV events (vLLM's wire format, both layouts, bridged
// into kvroute's hash space): the events move the index, and its
// predictions of cached tokens become closer to what the engines confirm.
func TestPreciseCacheState(t *testing.T) {
	w, prof := evictingFleet(t)
	for _, top := range []Topology{{Gateways: 1, Workers: 1}, {Gateways: 2, Workers: 2, Seed: 1}} {
		t.Run(fmt.Sprintf("%dx%d", top.Gateways, top.Workers), func(t *testing.T) { preciseAgainstApproximate(t, w, prof, top) })
	}
}

func preciseAgainstApproximate(t *testing.T, w *workload.Workload, prof sim.Profile, top Topology) {
	run := func(precise bool) (float64, float64, *PreciseRouter) {
		var r Router
		var err error
		if top.Gateways == 1 && top.Workers == 1 {
			r, err = NewStrategy("kv_cache_aware", 4, StrategyOptions{Seed: 1, Profile: prof})
		} else {
			r, err = NewTopology("kv_cache_aware", 4, StrategyOptions{Seed: 1, Profile: prof}, top)
		}
		if err != nil {
			t.Fatal(err)
		}
		var rt Router = r
		var p *PreciseRouter
		if precise {
			if p, err = NewPrecise(r); err != nil {
				t.Fatal(err)
			}
			rt = p
		}
		res, err := Run(Config{Replicas: 4, Profile: prof}, w, rt)
		if err != nil {
			t.Fatal(err)
		}
		st, _ := RouterStats(r)
		return st.PredictionError(), res.Summarize().HitRatio, p
	}
	approxErr, approxHit, _ := run(false)
	preciseErr, preciseHit, p := run(true)
	t.Logf("prediction error approximate %.1f%% precise %.1f%%; hit ratio %.1f%% vs %.1f%%; bridge %+v; deltas applied %v",
		100*approxErr, 100*preciseErr, 100*approxHit, 100*preciseHit, p.BridgeStats(), p.Applied)
	if p.DecodeErrors != 0 {
		t.Fatalf("%d event batches did not decode", p.DecodeErrors)
	}
	st := p.BridgeStats()
	if st.Matched == 0 || st.Removed == 0 || p.Applied[0] == 0 || p.Applied[1] == 0 {
		t.Fatalf("the events moved nothing: bridge %+v, applied %v", st, p.Applied)
	}
	if st.Unmatched*10 > st.Matched {
		t.Errorf("%d of %d stored events unexplained by the routing", st.Unmatched, st.Matched+st.Unmatched)
	}
	if preciseErr >= approxErr || preciseErr > 0.10 {
		t.Errorf("precise prediction error %.3f, approximate %.3f: want precise below both it and 10%%", preciseErr, approxErr)
	}
}

// TestCorrectionWithoutCapacity: a gateway that does not know the engines'
// KV capacity (no metrics service) believes every block it ever routed;
// cached_tokens corrects the index and the prediction error falls.
func TestCorrectionWithoutCapacity(t *testing.T) {
	w, prof := evictingFleet(t)
	var errs [2]float64
	for i, noCorrect := range []bool{true, false} {
		r, err := NewStrategy("kv_cache_aware", 4, StrategyOptions{Seed: 1, Profile: prof, NoCapacity: true, NoCorrect: noCorrect})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Run(Config{Replicas: 4, Profile: prof}, w, r); err != nil {
			t.Fatal(err)
		}
		st, _ := RouterStats(r)
		errs[i] = st.PredictionError()
		if !noCorrect && r.(*RealRouter).ix.Metrics().Corrections == 0 {
			t.Error("no correction was made")
		}
	}
	t.Logf("prediction error without corrections %.1f%%, with %.1f%%", 100*errs[0], 100*errs[1])
	if errs[1] >= errs[0] {
		t.Errorf("corrections did not lower the prediction error: %.3f with, %.3f without", errs[1], errs[0])
	}
}

// TestPreciseMarksEveryWorkersHosts: the scorers of every worker of every
// gateway see the hosts' cache state as precise (scorer.Host.PreciseCache,
// which kv_cache_aware's prefix score weighs), as the filter does for the
// hosts the metrics service trusts; without NewPrecise none do.
func TestPreciseMarksEveryWorkersHosts(t *testing.T) {
	for _, precise := range []bool{false, true} {
		r, err := NewTopology("kv_cache_aware", 3, StrategyOptions{Seed: 1}, Topology{Gateways: 2, Workers: 2, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		if precise {
			if _, err := NewPrecise(r); err != nil {
				t.Fatal(err)
			}
		}
		for g, gw := range r.gws {
			for w, wr := range gw.workers {
				for i, h := range wr.hosts {
					if h.PreciseCache != precise {
						t.Errorf("precise=%v: gateway %d worker %d host %d PreciseCache = %v", precise, g, w, i, h.PreciseCache)
					}
				}
			}
		}
	}
}

// TestCapacityScale: the index given more (or less) capacity than the
// engines hold ages fewer (or more) blocks out on the same traffic, and a
// peer's own index size is kept.
func TestCapacityScale(t *testing.T) {
	w, prof := evictingFleet(t)
	evictions := func(name string, scale float64) uint64 {
		r, err := NewStrategy(name, 4, StrategyOptions{Seed: 1, Profile: prof, CapacityScale: scale})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Run(Config{Replicas: 4, Profile: prof}, w, r); err != nil {
			t.Fatal(err)
		}
		return r.(*RealRouter).ix.Metrics().Evictions
	}
	half, own, double := evictions("kv_cache_aware", 0.5), evictions("kv_cache_aware", 0), evictions("kv_cache_aware", 2)
	t.Logf("evicted units at 0.5x, 1x, 2x capacity: %d, %d, %d", half, own, double)
	if own == 0 || !(half > own && own > double) {
		t.Errorf("evicted units at 0.5x, 1x, 2x capacity: %d, %d, %d: want strictly fewer as capacity grows", half, own, double)
	}
	if a, b := evictions("gie_default", 0), evictions("gie_default", 2); a != b {
		t.Errorf("gie_default's own index size moved with the scale: %d against %d evicted units", b, a)
	}
}
