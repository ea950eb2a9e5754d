package fleet

import (
	"time"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/workload"
)

// Oracle is what a clairvoyant router could deliver on a workload: every
// request finds the cached prefix a cache of the given size would hold
// for it and waits for nothing, so its first token comes after the
// prefill of its uncached tokens alone on an idle engine
// (sim.Profile.PrefillTime). With an unbounded cache (replicas <= 0) each
// request's TTFT is a lower bound on its TTFT under any router on any
// fleet of that profile: no engine holds more of a prompt than the
// earlier prompts shared with it, and batching or queueing only adds
// time. A bound on every request is a bound on every percentile, so the
// oracle's TTFT p90 is a floor no routing goes below. With the fleet's
// pooled capacity (replicas x the profile's blocks) it is the pooled
// ceiling with no queueing: the target a router near the ceiling aims at.
type Oracle struct {
	HitRatio float64
	TTFT     Percentiles
}

// RunOracle computes the oracle of w on replicas engines of profile p
// (replicas <= 0: one unbounded cache).
func RunOracle(w *workload.Workload, p sim.Profile, replicas int) Oracle {
	blocks := 0
	if replicas > 0 {
		blocks = replicas * p.NumGPUBlocks()
	}
	lru := sim.NewPrefixLRU(blocks, p.BlockSize)
	ttft := make([]time.Duration, 0, len(w.Requests))
	var cached, input int64
	for i := range w.Requests {
		r := &w.Requests[i]
		c := lru.Serve(sim.BlockChain(r.Text(), p.BlockSize), r.PromptTokens)
		cached += int64(c)
		input += int64(r.PromptTokens)
		ttft = append(ttft, p.PrefillTime(c, r.PromptTokens-c))
	}
	o := Oracle{TTFT: percentiles(ttft)}
	if input > 0 {
		o.HitRatio = float64(cached) / float64(input)
	}
	return o
}

// UnqueuedTTFT is the run's TTFT with the cache hits it got and no
// queueing: each request's prefill of its uncached tokens alone on an idle
// engine of profile p. Against the run's TTFT it splits the tail into what
// the cache hits allow and what waiting behind other work adds; against
// the oracle, what better hits could still give.
func (r *Result) UnqueuedTTFT(p sim.Profile) Percentiles {
	var d []time.Duration
	for _, rec := range r.Records {
		if !rec.Rejected {
			d = append(d, p.PrefillTime(rec.CachedTokens, rec.PromptTokens-rec.CachedTokens))
		}
	}
	return percentiles(d)
}
