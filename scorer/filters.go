package scorer

import (
	"math"
	"slices"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/snapshot"
)

func init() {
	Register("healthy", KindFilter,
		"drops hosts whose circuit breaker is open, that stopped answering scrapes, or (dropStale) whose pushed state is stale; keeps everyone if nobody is left (failOpen)",
		func(p *config.Params) Plugin {
			return &healthyFilter{dropStale: p.Bool("dropStale", true), failOpen: p.Bool("failOpen", true)}
		})
	Register("role", KindFilter,
		"keeps hosts that serve the role being picked (auto: decode or prefill in a disaggregated handler, any otherwise)",
		func(p *config.Params) Plugin {
			r := p.Enum("role", "auto", "auto", snapshot.RolePrefill, snapshot.RoleDecode, snapshot.RoleBoth)
			f := &roleFilter{auto: r == "auto"}
			if !f.auto {
				f.role, _ = ParseRole(r)
			}
			return f
		})
	Register("model", KindFilter,
		"keeps hosts serving the request's model (hosts that declare no model serve any); requireAdapter also requires the LoRA adapter loaded or loadable",
		func(p *config.Params) Plugin {
			return &modelFilter{requireAdapter: p.Bool("requireAdapter", false)}
		})
	Register("saturation", KindFilter,
		"drops hosts over the waiting-queue or KV-utilization threshold while others remain",
		func(p *config.Params) Plugin {
			return &saturationFilter{
				maxWaiting: p.Int("maxWaiting", 128, 1, 1<<30),
				maxKVUsage: p.Float("maxKVUsage", 0.95, 0, 1),
			}
		})
	Register("load_guard", KindFilter,
		"the imbalance guard: drops hosts whose token work exceeds the best host's by more than absoluteTokens AND by more than relative times; work is outstanding tokens plus, with basis cost, this request's uncached tokens there, less prefixCredit times the tokens of this request the host holds",
		func(p *config.Params) Plugin {
			return &loadGuard{
				absTokens:    float64(p.Int("absoluteTokens", 32768, 0, math.MaxInt32)),
				rel:          p.Float("relative", 1.5, 1, 1000),
				decodeWeight: p.Float("decodeWeight", 0.05, 0, 100),
				queuedTokens: float64(p.Int("waitingTokens", 0, 0, 1<<30)),
				withRequest:  p.Enum("basis", "cost", "cost", "load") == "cost",
				prefixCredit: p.Float("prefixCredit", 0, 0, 100),
			}
		})
}

type healthyFilter struct{ dropStale, failOpen bool }

func (*healthyFilter) Type() string { return "healthy" }

func (f *healthyFilter) ok(h *Host) bool {
	return !h.BreakerOpen && !h.Unhealthy && !(f.dropStale && h.Stale)
}

// Filter compacts cand in place in one pass. When nobody is healthy nothing
// was moved, so failing open can still return cand as it came. One loop rather
// than a count then a copy: each function entered costs a request
// (docs/performance.md), and this filter runs on every request.
func (f *healthyFilter) Filter(c *Cycle, cand []int) []int {
	n := 0
	for _, h := range cand {
		if f.ok(&c.Hosts[h]) {
			cand[n] = h
			n++
		}
	}
	if n == 0 && f.failOpen {
		return f.failOpenTo(c, cand)
	}
	return cand[:n]
}

// failOpenTo is Filter when nobody passed, out of its line (noinline): each
// function entered costs a request (docs/performance.md). Stale pushed state
// (the metrics service down) makes every host stale at once: then the
// hosts last known healthy with a closed breaker are kept, since stale
// state may drop load numbers but not what it knew about health. Only when
// none is left does it keep everyone: a breaker-open or unhealthy host may
// still answer, and Envoy's retries follow the fallbacks, where refusing
// would turn a partial outage into a total one.
//
//go:noinline
func (f *healthyFilter) failOpenTo(c *Cycle, cand []int) []int {
	n := 0
	if f.dropStale {
		for _, h := range cand {
			if host := &c.Hosts[h]; !host.BreakerOpen && !host.Unhealthy {
				cand[n] = h
				n++
			}
		}
	}
	if n > 0 {
		c.Note("pushed state stale: keeping the hosts last known healthy")
		return cand[:n]
	}
	c.Note("no healthy host: failing open")
	return cand
}

type roleFilter struct {
	auto bool
	role Role
}

func (*roleFilter) Type() string { return "role" }

// wants returns the role f picks hosts for in c, and whether it keeps
// every host (auto, outside a disaggregated handler).
func (f *roleFilter) wants(c *Cycle) (want Role, all bool) {
	want = f.role
	if f.auto {
		want = c.Role
	}
	return want, f.auto && want == RoleBoth
}

// roleKeeps reports whether the role filter keeps a host of role r when it
// picks for want. A configured role "both" keeps only aggregated hosts.
func roleKeeps(want, r Role) bool { return r == want || r == RoleBoth }

func (f *roleFilter) Filter(c *Cycle, cand []int) []int {
	want, all := f.wants(c)
	if all {
		return cand
	}
	n := 0 // in place without keep's closure, nor append's growth path
	for _, h := range cand {
		if roleKeeps(want, c.Hosts[h].Role) {
			cand[n] = h
			n++
		}
	}
	return cand[:n]
}

type modelFilter struct{ requireAdapter bool }

func (*modelFilter) Type() string { return "model" }

func (f *modelFilter) Filter(c *Cycle, cand []int) []int {
	model, adapter := c.Req.Model, c.Req.Adapter
	if f.requireAdapter && adapter != "" {
		return f.filterAdapter(c, cand, model, adapter)
	}
	if model == "" {
		return cand
	}
	// In place without keep's closure: an indirect call per host costs
	// more than the test in Wasm, and this filter runs on every request
	// that names a model.
	n := 0
	for _, i := range cand {
		if h := &c.Hosts[i]; servesModel(h.Model, model) || len(h.Adapters) > 0 && listsAdapter(h, model) {
			cand[n] = i
			n++
		}
	}
	return cand[:n]
}

// servesModel reports whether a host declaring model m serves requests for
// model: hosts that declare none serve any. A host also serves the LoRA
// adapters it lists (Host.Adapters), which the callers test after this:
// an adapter the configuration does not map to a base model reaches the
// filter as the model itself.
func servesModel(m, model string) bool { return m == "" || m == model }

// listsAdapter reports whether h lists model among its adapters. Out of
// line (noinline): only a host declaring another model enters it, and the
// code of a function entered costs every request (docs/performance.md).
//
//go:noinline
func listsAdapter(h *Host, model string) bool { return slices.Contains(h.Adapters, model) }

// filterAdapter is Filter for requests that name an adapter the filter
// requires: a function of its own so that the common case, a model alone,
// enters only the short loop above (each function entered costs a request:
// docs/performance.md).
func (f *modelFilter) filterAdapter(c *Cycle, cand []int, model, adapter string) []int {
	out := cand[:0]
	for _, i := range cand {
		h := &c.Hosts[i]
		if model != "" && h.Model != "" && h.Model != model {
			continue
		}
		if adapterState(h, adapter) == 0 {
			continue
		}
		out = append(out, i)
	}
	return out
}

// adapterState is 2 when the adapter is loaded, 1 when a slot is free to
// load it (or capacity is unknown), 0 when the host is full: a request for
// a new adapter there waits until a running adapter's requests drain
// (vLLM's scheduler skips it while max_loras adapters are in the batch).
func adapterState(h *Host, adapter string) int {
	if slices.Contains(h.Adapters, adapter) {
		return 2
	}
	used := h.AdapterSlotsUsed
	if used == 0 {
		used = len(h.Adapters)
	}
	if h.MaxAdapters == 0 || used < h.MaxAdapters {
		return 1
	}
	return 0
}

type saturationFilter struct {
	maxWaiting int
	maxKVUsage float64
}

func (*saturationFilter) Type() string { return "saturation" }

func (f *saturationFilter) saturated(h *Host) bool {
	if h.Stale {
		return false // no trustworthy figures: do not judge
	}
	return h.Waiting >= f.maxWaiting || h.KVUsage >= f.maxKVUsage
}

// Filter compacts cand in place in one pass; when every host is saturated
// nothing was moved and cand is returned as it came.
func (f *saturationFilter) Filter(c *Cycle, cand []int) []int {
	n := 0
	for _, h := range cand {
		if !f.saturated(&c.Hosts[h]) {
			cand[n] = h
			n++
		}
	}
	if n == 0 || n == len(cand) {
		return cand // all saturated: dropping everyone helps nobody
	}
	c.Note("saturated hosts skipped")
	return cand[:n]
}

// loadGuard is kvroute's imbalance guard, in the spirit of SGLang's two
// thresholds but measured in tokens, not requests: one 100k-token prompt is
// not the same load as one 100-token prompt. A host is too loaded to chase
// affinity on when its work exceeds the best candidate's by more than
// absTokens and by more than rel times. The absolute term keeps an idle
// fleet from ping-ponging over a few tokens; the relative term scales with
// traffic.
//
// With basis "cost" (the default) a host's work includes the prompt tokens
// this request would have to compute there, so a warm host is judged by
// what sending the request there really costs: a host 40k tokens busy that
// holds 38k of a 40k-token prompt costs 42k, about what an idle host that
// must compute all 40k costs, and keeps the request. With basis "load"
// only outstanding work counts, which evicts affinity far too early on
// long prompts (docs/strategies.md, "kv_cache_aware: the knobs").
//
// prefixCredit makes the guard weigh what a spill costs beyond this
// request: the prefix a warm host holds is computed again elsewhere, held
// twice in the fleet's KV memory, and the prompt's group is split between
// two hosts. A host's work is judged net of prefixCredit times its matched
// tokens (the best host's work, the bound's base, is not), so the longer
// the prefix a host holds, the larger the backlog it may carry before the
// guard drops it.
type loadGuard struct {
	absTokens    float64
	rel          float64
	decodeWeight float64
	queuedTokens float64 // tokens assumed per pushed waiting request
	withRequest  bool
	prefixCredit float64
}

func (*loadGuard) Type() string { return "load_guard" }

// tokenLoad is outstanding work in prompt-token equivalents.
func tokenLoad(h *Host, decodeWeight, queuedTokens float64) float64 {
	l := float64(h.PendingPrefillTokens) + decodeWeight*float64(h.PendingDecodeTokens)
	if queuedTokens > 0 && !h.Stale {
		l += queuedTokens * float64(h.Waiting)
	}
	return l
}

func (g *loadGuard) Filter(c *Cycle, cand []int) []int {
	if len(cand) < 2 {
		return cand
	}
	load := c.Floats()
	minL := -1.0
	for _, h := range cand {
		l := tokenLoad(&c.Hosts[h], g.decodeWeight, g.queuedTokens)
		if g.withRequest {
			l += float64(c.Req.Uncached(h))
		}
		load[h] = l
		if minL < 0 || l < minL {
			minL = l
		}
	}
	bound := minL + g.absTokens
	if r := minL * g.rel; r > bound {
		bound = r
	}
	n := 0
	for _, h := range cand {
		l := load[h]
		if g.prefixCredit > 0 {
			_, t := c.Req.Matched(h)
			l -= g.prefixCredit * float64(t)
		}
		if l <= bound {
			cand[n] = h
			n++
		}
	}
	if n < len(cand) {
		c.Note("imbalance guard")
	}
	return cand[:n]
}
