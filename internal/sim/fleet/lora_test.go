package fleet

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/workload"
	"github.com/kvroute/kvroute/scorer"
)

// On a fleet serving 16 LoRA adapters, 4 per batch, the default profile
// with its lora_affinity scorer loads fewer adapters and cuts tail TTFT
// against the same profile without it.
func TestDefaultProfileLoRAAffinityCutsAdapterLoads(t *testing.T) {
	p, _ := sim.LookupProfile("")
	p.MaxLoRAs, p.LoRALoadTime = 4, 50*time.Millisecond
	w, err := workload.MultiTurn{Users: 100, Rounds: 6, SystemTokens: 1000, QuestionTokens: 300,
		OutputTokens: 200, Rate: 2, ThinkTime: 5 * time.Second, Seed: 3}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	w.AssignAdapters(16, 1)
	// The bench's comparison profile (docs/performance.md): the preset
	// without lora_affinity, and nothing else changed.
	noLoRA, err := os.ReadFile("../../../testdata/bench/kv_cache_aware_no_lora.json")
	if err != nil {
		t.Fatal(err)
	}
	_, h, _, err := scorer.Load(noLoRA)
	if err != nil {
		t.Fatal(err)
	}
	preset, _ := scorer.Preset("kv_cache_aware")
	if a, b := h.Decode.Scorers, preset.Scorers; len(a) != len(b)-1 || b[len(b)-1].Name != "lora_affinity" ||
		len(h.Decode.Filters) != len(preset.Filters) || !h.Decode.CorrectIndex {
		t.Fatalf("kv_cache_aware_no_lora is not the preset minus lora_affinity: %d scorers, %d filters", len(a), len(h.Decode.Filters))
	}
	for i := range h.Decode.Scorers {
		if x, y := h.Decode.Scorers[i], preset.Scorers[i]; x.Name != y.Name || x.Weight != y.Weight || fmt.Sprint(x.Scorer) != fmt.Sprint(y.Scorer) {
			t.Fatalf("scorer %d: %s %v x%v, preset %s %v x%v", i, x.Name, x.Scorer, x.Weight, y.Name, y.Scorer, y.Weight)
		}
	}
	run := func(name string) (Summary, int64) {
		r, err := NewStrategy(name, 8, StrategyOptions{Seed: 1, Profile: p, Config: noLoRA})
		if err != nil {
			t.Fatal(err)
		}
		var loads int64
		res, err := Run(Config{Replicas: 8, Profile: p}, w, loadCounter{r, &loads})
		if err != nil {
			t.Fatal(err)
		}
		return res.Summarize(), loads
	}
	with, withLoads := run("kv_cache_aware")
	without, withoutLoads := run("kv_cache_aware_no_lora")
	t.Logf("TTFT p90/p99 with lora_affinity %v/%v (%d adapter loads), without %v/%v (%d)",
		with.TTFT.P90, with.TTFT.P99, withLoads, without.TTFT.P90, without.TTFT.P99, withoutLoads)
	if withLoads >= withoutLoads || with.TTFT.P90 >= without.TTFT.P90 {
		t.Errorf("lora_affinity: %d loads and TTFT p90 %v, want fewer than without it (%d, %v)", withLoads, with.TTFT.P90, withoutLoads, without.TTFT.P90)
	}
}

// loadCounter passes a router through and keeps the fleet's adapter loads
// as the last pushed engine state says.
type loadCounter struct {
	Router
	loads *int64
}

func (l loadCounter) ObserveState(st []sim.Stats, now time.Duration) {
	var n int64
	for _, s := range st {
		n += s.LoRALoads
	}
	*l.loads = n
	l.Router.(StateObserver).ObserveState(st, now)
}

func (l loadCounter) FirstToken(r *workload.Request, replica int, now time.Duration) {
	l.Router.(FirstTokenObserver).FirstToken(r, replica, now)
}

func (l loadCounter) Done(r *workload.Request, replica int, cached int, now time.Duration) {
	l.Router.(DoneObserver).Done(r, replica, cached, now)
}
