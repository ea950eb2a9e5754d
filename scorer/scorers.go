package scorer

import (
	"math"

	"github.com/kvroute/kvroute/config"
)

func init() {
	Register("prefix_cache", KindScorer,
		"affinity: the fraction of the request the index believes the host holds: matched over total tokens (unit tokens, the default) or blocks (unit blocks, as GIE counts); with scaleTokens, matched tokens over that scale (capped at 1); preciseScale multiplies the score of hosts under precise cache state (default 1)",
		func(p *config.Params) Plugin {
			return &prefixScorer{
				blocks:       p.Enum("unit", "tokens", "tokens", "blocks") == "blocks",
				scale:        float64(p.Int("scaleTokens", 0, 0, 1<<30)),
				preciseScale: p.Float("preciseScale", 1, 0, 1),
			}
		})
	Register("kv_utilization", KindScorer,
		"balance: 1 minus the host's KV-cache utilization (stale state scores 0.5)",
		func(p *config.Params) Plugin { return kvUtilScorer{} })
	Register("queue", KindScorer,
		"distribution: the engine's waiting queue, min-max normalised (shortest queue scores 1)",
		func(p *config.Params) Plugin {
			return loadScorer{typ: "queue", figure: loadWaiting}
		})
	Register("running", KindScorer,
		"distribution: the engine's running requests, min-max normalised",
		func(p *config.Params) Plugin {
			return loadScorer{typ: "running", figure: loadRunning}
		})
	Register("least_request", KindScorer,
		"distribution: the gateway's own in-flight requests, min-max normalised",
		func(p *config.Params) Plugin {
			return loadScorer{typ: "least_request", figure: loadInFlight}
		})
	Register("pending_tokens", KindScorer,
		"distribution: token-aware load, prompt tokens not yet prefilled plus decodeWeight times decode tokens outstanding, min-max normalised",
		func(p *config.Params) Plugin {
			return loadScorer{typ: "pending_tokens", figure: loadPendingTokens, decodeWeight: p.Float("decodeWeight", 0.05, 0, 100)}
		})
	Register("prefill_cost", KindScorer,
		"distribution: estimated prefill work ahead of the request, in tokens: pending prompt tokens plus this request's uncached tokens (plus decodeWeight times decode tokens); the cheapest host scores 1, others cheapest/cost",
		func(p *config.Params) Plugin {
			return &prefillCostScorer{
				decodeWeight: p.Float("decodeWeight", 0.05, 0, 100),
				scaleTokens:  float64(p.Int("scaleTokens", 0, 0, 1<<30)),
			}
		})
	Register("predicted_ttft", KindScorer,
		"distribution: time to first token predicted by each host's learned model, base delay plus milliseconds per token times prefill_cost's work (pending prompt tokens, this request's uncached tokens, decodeWeight times decode tokens); the fastest host scores 1, others fastest/predicted, or with scaleMs 1 - extra/scaleMs",
		func(p *config.Params) Plugin {
			return &ttftScorer{
				decodeWeight: p.Float("decodeWeight", 0.05, 0, 100),
				scaleMs:      float64(p.Int("scaleMs", 0, 0, 1<<30)),
			}
		})
	Register("session_affinity", KindScorer,
		"affinity: 1 for the host the request's session is pinned to, 0 for the others",
		func(p *config.Params) Plugin { return &addressScorer{typ: "session_affinity"} })
	Register("prefix_memory", KindScorer,
		"affinity: 1 for the host that last served a request with the same leading prompt prefix (the router's memory, which outlives the index's), 0 for the others",
		func(p *config.Params) Plugin { return &addressScorer{typ: "prefix_memory", memory: true} })
	Register("prefix_home", KindScorer,
		"affinity: 1 for the request's home host, the candidate that rendezvous hashing of the prompt-prefix hash ranks first, 0 for the others; keeps a prefix group together when the index has forgotten it",
		func(p *config.Params) Plugin { return prefixHomeScorer{} })
	Register("lora_affinity", KindScorer,
		"affinity: 1 when the requested LoRA adapter is loaded, 0.5 when a slot is free to load it, 0 when the host's adapter slots are full; not run (weight included) for requests without an adapter",
		func(p *config.Params) Plugin { return loraScorer{} })
	Register("latency", KindScorer,
		"balance: time-to-first-byte EWMA, fastest scores 1, others fastest/latency; hosts without samples score 1",
		func(p *config.Params) Plugin { return latencyScorer{} })
}

// prefixScorer scores the cached fraction of the prompt. Tokens are the
// default unit because kvroute's index hashes long prompts in blocks that
// grow along the chain: a match over the first, short blocks covers fewer
// tokens than its share of blocks suggests. With uniform blocks (GIE's
// index) both units agree.
//
// With scaleTokens the score is matched tokens over that scale, capped at 1:
// an absolute measure, comparable with prefill_cost's scaleTokens. Paired
// with equal scales and weights, the two choose the host that maximises
// matched tokens minus extra prefill tokens, so a 1,000-token match is
// worth 1,000 tokens of queue — whether the prompt is 2k or 60k long —
// instead of the whole weight of the prefix scorer.
//
// preciseScale weighs a host whose cache state is precise (Host.PreciseCache)
// below one whose state the index guesses. prefill_cost already credits the
// matched tokens as prefill work saved; on top of it the prefix score is a
// bet that the match is real. Under approximate state that bet covers the
// index's misses. Under precise state the match is confirmed, including old
// prefixes the engine kept and the approximate index forgot, and the full
// bet sends those requests to the hosts that kept them, concentrating load
// there (docs/cache-state.md#measured). kv_cache_aware sets it to 2/3.
//
// Like prefillCostScorer it is held by pointer: a struct with fields called
// through an interface by value goes through a generated (*T).Score
// wrapper, one more function each request enters in Wasm.
type prefixScorer struct {
	blocks       bool
	scale        float64
	preciseScale float64
}

func (prefixScorer) Type() string       { return "prefix_cache" }
func (prefixScorer) Category() Category { return Affinity }
func (p *prefixScorer) Score(c *Cycle, cand []int, out []float64) {
	total := c.Req.PromptTokens
	if p.blocks {
		total = c.Req.TotalBlocks
	} else if p.scale > 0 {
		total = int(p.scale)
	}
	for _, h := range cand {
		if total <= 0 {
			out[h] = 0
			continue
		}
		b, t := c.Req.Matched(h)
		if p.blocks {
			t = b
		}
		v := float64(t) / float64(total)
		if v > 1 { // not min: in Wasm that is a runtime call per host
			v = 1
		}
		if c.Hosts[h].PreciseCache {
			v *= p.preciseScale
		}
		out[h] = v
	}
}

type kvUtilScorer struct{}

func (kvUtilScorer) Type() string       { return "kv_utilization" }
func (kvUtilScorer) Category() Category { return Balance }
func (kvUtilScorer) Score(c *Cycle, cand []int, out []float64) {
	for _, h := range cand {
		host := &c.Hosts[h]
		if host.Stale {
			out[h] = 0.5
			continue
		}
		out[h] = 1 - host.KVUsage
	}
}

// loadScorer min-max normalises a load figure, as GIE's queue scorer does:
// the least loaded candidate scores 1, the most loaded 0, all equal 1.
type loadScorer struct {
	typ          string
	figure       loadFigure
	decodeWeight float64 // pending_tokens only
}

// loadFigure is the host field a loadScorer reads: a switch the compiler
// inlines rather than a closure called per host (an indirect call in Wasm).
type loadFigure uint8

const (
	loadWaiting       loadFigure = iota // queue
	loadRunning                         // running
	loadInFlight                        // least_request
	loadPendingTokens                   // pending_tokens
)

func (s loadScorer) load(h *Host) float64 {
	switch s.figure {
	case loadWaiting:
		return float64(h.Waiting)
	case loadRunning:
		return float64(h.Running)
	case loadInFlight:
		return float64(h.InFlight)
	}
	return float64(h.PendingPrefillTokens) + s.decodeWeight*float64(h.PendingDecodeTokens)
}

func (s loadScorer) Type() string     { return s.typ }
func (loadScorer) Category() Category { return Distribution }
func (s loadScorer) Score(c *Cycle, cand []int, out []float64) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, h := range cand {
		l := s.load(&c.Hosts[h])
		out[h] = l
		if l < lo || l != l { // min and max as comparisons (Wasm: no runtime calls), NaN kept
			lo = l
		}
		if l > hi || l != l {
			hi = l
		}
	}
	span := hi - lo
	for _, h := range cand {
		if span <= 0 {
			out[h] = 1
		} else {
			out[h] = (hi - out[h]) / span
		}
	}
}

// prefillCostScorer is the token cost of Dynamo's router seen from the
// request: work queued on the host plus the prompt tokens it would have to
// compute for this request. It is a distribution scorer (it spreads by
// tokens), but it also rewards cache hits, which is why kv_cache_aware pairs
// it with prefix_cache at a lower weight instead of trusting either alone.
//
// By default a host scores cheapest/cost, a ratio. With scaleTokens set the
// score falls linearly with the extra tokens over the cheapest host,
// 1 - extra/scaleTokens (0 beyond), so it weighs what TTFT feels — extra
// prefill time — rather than a ratio: 2x the cost of a 500-token prompt is
// nothing, 2x the cost of a 60k-token prompt is seconds.
type prefillCostScorer struct{ decodeWeight, scaleTokens float64 }

func (prefillCostScorer) Type() string       { return "prefill_cost" }
func (prefillCostScorer) Category() Category { return Distribution }
func (s *prefillCostScorer) Score(c *Cycle, cand []int, out []float64) {
	best := math.Inf(1)
	for _, h := range cand {
		cost := tokenLoad(&c.Hosts[h], s.decodeWeight, 0) + float64(c.Req.Uncached(h))
		out[h] = cost
		if cost < best || cost != cost { // min as a comparison (Wasm: no runtime call), NaN kept
			best = cost
		}
	}
	if s.scaleTokens <= 0 {
		costRatios(cand, out, best)
		return
	}
	for _, h := range cand {
		v := 1 - (out[h]-best)/s.scaleTokens
		if v < 0 || v == 0 { // max(0, v): +0 for -0 too; NaN kept
			v = 0
		}
		out[h] = v
	}
}

// ttftScorer is prefill_cost in milliseconds: each host's work in tokens
// through the time-to-first-token model the router learns for it online
// (Host.TTFTBaseMs + Host.TTFTMsPerToken x work), so a host that prefills
// at half the rate costs twice as much for the same tokens. A host with no
// model yet (TTFTMsPerToken 0) counts its work at one millisecond per
// token over no base: with no host learned, the scorer ranks as
// prefill_cost does. The router fills hosts it has not learned with the
// mean of those it has, so one slow sample does not decide the others.
type ttftScorer struct{ decodeWeight, scaleMs float64 }

func (ttftScorer) Type() string       { return "predicted_ttft" }
func (ttftScorer) Category() Category { return Distribution }
func (s *ttftScorer) Score(c *Cycle, cand []int, out []float64) {
	best := math.Inf(1)
	for _, h := range cand {
		host := &c.Hosts[h]
		cost := tokenLoad(host, s.decodeWeight, 0) + float64(c.Req.Uncached(h))
		if host.TTFTMsPerToken > 0 {
			cost = host.TTFTBaseMs + host.TTFTMsPerToken*cost
		}
		out[h] = cost
		if cost < best || cost != cost {
			best = cost
		}
	}
	if s.scaleMs <= 0 {
		costRatios(cand, out, best)
		return
	}
	for _, h := range cand {
		v := 1 - (out[h]-best)/s.scaleMs
		if v < 0 || v == 0 {
			v = 0
		}
		out[h] = v
	}
}

// TTFTWork is the work the predicted_ttft scorer prices on hosts[i] for
// req, in tokens: what the router keeps with a decision so that the chosen
// host's model learns from the time its first token took.
func TTFTWork(req *Request, hosts []Host, i int, decodeWeight float64) float64 {
	return tokenLoad(&hosts[i], decodeWeight, 0) + float64(req.Uncached(i))
}

// costRatios turns the costs in out into the ratio scores, cheapest/cost. It
// is a function of its own because the default profile scores with
// scaleTokens: each function entered costs a request (docs/performance.md), so
// Score keeps to that path (hence noinline).
//
//go:noinline
func costRatios(cand []int, out []float64, best float64) {
	for _, h := range cand {
		if out[h] <= 0 || best <= 0 && out[h] <= best {
			out[h] = 1
		} else if best <= 0 {
			// The best host costs nothing; compare the others with one
			// token of slack so the score stays finite and ordered.
			out[h] = 1 / (1 + out[h])
		} else {
			out[h] = best / out[h]
		}
	}
}

// addressScorer scores 1 for the host at an address the router looked up
// for the request, 0 for the others. session_affinity reads the session
// table's pin (PinnedAddress). prefix_memory reads the router's prefix
// memory (PrefixAddress): session affinity without a session. The router
// remembers, per leading-prefix hash, which host served it last; the index
// forgets a prefix when the host's capacity estimate says it was evicted,
// and this memory keeps sending the group where its other requests went, so
// a conversation whose history was evicted is recomputed in one place
// instead of wherever load is lowest.
//
// One type for both, so the default profile, which weighs both, enters one
// copy of the loop: each function entered costs a request
// (docs/performance.md).
type addressScorer struct {
	typ    string
	memory bool // PrefixAddress rather than PinnedAddress
}

func (s *addressScorer) Type() string     { return s.typ }
func (*addressScorer) Category() Category { return Affinity }
func (s *addressScorer) Score(c *Cycle, cand []int, out []float64) {
	addr := c.Req.PinnedAddress
	if s.memory {
		addr = c.Req.PrefixAddress
	}
	for _, h := range cand {
		if addr != "" && c.Hosts[h].Address == addr {
			out[h] = 1
		} else {
			out[h] = 0
		}
	}
}

// prefixHomeScorer gives every prompt prefix a home host by rendezvous
// hashing, the prefix_hash strategy's first choice. As a low-weight
// tie-breaker it places requests whose prefix the index no longer knows
// (evicted, or never seen) where the rest of their group went, instead of
// wherever load happens to be lowest, which keeps one copy of a group's
// cache instead of several. Every gateway worker computes the same home
// without sharing any state.
type prefixHomeScorer struct{}

func (prefixHomeScorer) Type() string       { return "prefix_home" }
func (prefixHomeScorer) Category() Category { return Affinity }
func (prefixHomeScorer) Score(c *Cycle, cand []int, out []float64) {
	key := c.Req.PrefixHash
	home, best := -1, uint64(0)
	for _, h := range cand {
		out[h] = 0
		if key == 0 {
			continue
		}
		if w := mix64(key ^ hostID(&c.Hosts[h])); home < 0 || w > best {
			home, best = h, w
		}
	}
	if home >= 0 {
		out[home] = 1
	}
}

type loraScorer struct{}

func (loraScorer) Type() string       { return "lora_affinity" }
func (loraScorer) Category() Category { return Affinity }
func (loraScorer) Score(c *Cycle, cand []int, out []float64) {
	a := c.Req.Adapter
	for _, h := range cand {
		if a == "" { // Profile.run skips it then; a caller of Score may not
			out[h] = 1
			continue
		}
		out[h] = float64(adapterState(&c.Hosts[h], a)) / 2
	}
}

type latencyScorer struct{}

func (latencyScorer) Type() string       { return "latency" }
func (latencyScorer) Category() Category { return Balance }
func (latencyScorer) Score(c *Cycle, cand []int, out []float64) {
	best := math.Inf(1)
	for _, h := range cand {
		if l := c.Hosts[h].LatencyEWMAMs; l > 0 {
			best = min(best, l)
		}
	}
	for _, h := range cand {
		l := c.Hosts[h].LatencyEWMAMs
		if l <= 0 || math.IsInf(best, 1) {
			out[h] = 1
		} else {
			out[h] = best / l
		}
	}
}
