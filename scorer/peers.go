package scorer

import (
	"math"

	"github.com/kvroute/kvroute/config"
)

// Peer emulations, implemented from the peers' public descriptions so the
// benchmark compares kvroute with what they do, on the same index and load
// accounting (only the decision differs). Sources are cited per plugin and in
// docs/strategies.md, "Peer emulations".

func init() {
	Register("sglang_cache_aware", KindPicker,
		"SGLang router's cache_aware policy: shortest queue (in-flight requests) when the fleet is imbalanced, else the best prefix match above cacheThreshold, else the host with the smallest cache tree",
		func(p *config.Params) Plugin {
			return sglangPicker{
				cacheThreshold: p.Float("cacheThreshold", 0.3, 0, 1),
				balanceAbs:     float64(p.Int("balanceAbsThreshold", 64, 0, 1<<30)),
				balanceRel:     p.Float("balanceRelThreshold", 1.5, 1, 1000),
			}
		})
	Register("dynamo_kv", KindPicker,
		"NVIDIA Dynamo's KV router: cost = overlapWeight x prefill blocks to compute + decode blocks active; lowest cost, or softmax sampling when temperature > 0",
		func(p *config.Params) Plugin {
			return dynamoPicker{
				overlapWeight: p.Float("overlapWeight", 1.0, 0, 1000),
				temperature:   p.Float("temperature", 0, 0, 1e6),
			}
		})
}

// sglangPicker follows the SGLang router's cache-aware load balancing as its
// documentation and source comments describe it (sgl-project/sglang,
// sgl-router: README and docs/router/router.md; policy cache_aware):
//
//   - The load of a worker is the router's count of its in-flight requests.
//   - The system is imbalanced when max-min > balance_abs_threshold AND
//     max > balance_rel_threshold x min; then the least-loaded worker wins.
//   - Otherwise the worker with the longest prefix match wins when its match
//     rate (matched over request length) exceeds cache_threshold; below it,
//     the worker whose approximate tree is smallest (most free cache) wins.
//
// Defaults are the (and recent SGLang's): 0.3, 64, 1.5. The
// approximate radix tree is kvroute's index (the emulation's match rate is
// over tokens, SGLang's over characters).
type sglangPicker struct {
	cacheThreshold         float64
	balanceAbs, balanceRel float64
}

func (sglangPicker) Type() string { return "sglang_cache_aware" }
func (p sglangPicker) Pick(c *Cycle, cand []int, _ []float64, order []int) []int {
	load := c.Floats()
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, h := range cand {
		l := float64(c.Hosts[h].InFlight)
		load[h] = l
		lo, hi = min(lo, l), max(hi, l)
	}
	var primary int
	switch {
	case hi-lo > p.balanceAbs && hi > p.balanceRel*lo:
		c.Note("imbalanced: shortest queue")
		primary = argminRandomTie(c, cand, load)
	default:
		best, bestRate := -1, -1.0
		prompt := c.Req.PromptTokens
		for _, h := range cand {
			rate := 0.0
			if prompt > 0 {
				_, t := c.Req.Matched(h)
				rate = float64(t) / float64(prompt)
			}
			if rate > bestRate {
				best, bestRate = h, rate
			}
		}
		if bestRate > p.cacheThreshold {
			primary = best
		} else {
			c.Note("low match: smallest tree")
			bestSize := math.MaxInt
			for _, h := range cand {
				if s := c.Hosts[h].IndexedBlocks; s < bestSize {
					primary, bestSize = h, s
				}
			}
		}
	}
	order = append(order, primary)
	return appendByLeast(order, cand, load, c.MaxPicks)
}

// argminRandomTie is argmaxRandomTie for costs.
func argminRandomTie(c *Cycle, cand []int, v []float64) int {
	pick, best, ties := -1, math.Inf(1), 0
	for _, h := range cand {
		s := v[h]
		switch {
		case s < best-scoreEpsilon:
			pick, best, ties = h, s, 1
		case s <= best+scoreEpsilon:
			ties++
			if c.Rand.IntN(ties) == 0 {
				pick = h
			}
		}
	}
	return pick
}

// dynamoPicker follows NVIDIA Dynamo's KV router as its documentation
// describes it (docs.nvidia.com/dynamo, "KV Router" and "Router Design"):
// for each worker, potential prefill blocks = (input tokens - overlap blocks
// x block size) / block size, potential decode blocks = the worker's active
// blocks plus the request's; cost = kv_overlap_score_weight x prefill +
// decode; the lowest cost wins at router temperature 0, otherwise a softmax
// over normalised costs samples the worker. Active blocks are the gateway's
// InFlightTokens (prompt plus max tokens of requests in flight). Costs are
// kept in tokens: dividing both terms by the block size does not change the
// order.
type dynamoPicker struct{ overlapWeight, temperature float64 }

func (dynamoPicker) Type() string { return "dynamo_kv" }
func (p dynamoPicker) Pick(c *Cycle, cand []int, _ []float64, order []int) []int {
	cost := c.Floats()
	lo, hi := math.Inf(1), math.Inf(-1)
	req := float64(c.Req.PromptTokens + c.Req.MaxTokens)
	for _, h := range cand {
		v := p.overlapWeight*float64(c.Req.Uncached(h)) + float64(c.Hosts[h].InFlightTokens) + req
		cost[h] = v
		lo, hi = min(lo, v), max(hi, v)
	}
	var primary int
	if p.temperature == 0 || hi == lo {
		primary = argminRandomTie(c, cand, cost)
	} else {
		// Sample with probability ∝ exp(-normalised cost / T); keep the
		// costs in cost[] for the fallbacks by building logits in place
		// of a second buffer: normalised cost is in [0, 1].
		primary = sampleLowCost(c, cand, cost, lo, hi, p.temperature)
	}
	order = append(order, primary)
	return appendByLeast(order, cand, cost, c.MaxPicks)
}

func sampleLowCost(c *Cycle, cand []int, cost []float64, lo, hi, t float64) int {
	var sum float64
	for _, h := range cand {
		sum += math.Exp(-(cost[h] - lo) / (hi - lo) / t)
	}
	r := c.Rand.Float64() * sum
	for _, h := range cand {
		r -= math.Exp(-(cost[h] - lo) / (hi - lo) / t)
		if r < 0 {
			return h
		}
	}
	return cand[len(cand)-1]
}
