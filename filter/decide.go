package filter

import (
	"strconv"

	"github.com/cespare/xxhash/v2"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"

	"github.com/kvroute/kvroute/dispatch"
	"github.com/kvroute/kvroute/health"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/scorer"
)

// noCandidate handles a decision that every candidate was filtered out of.
// When no candidate serves the request's model at all, it answers as an
// OpenAI server does (404 model_not_found) rather than let Envoy's
// fallback policy send it to an engine serving another model (every preset
// has the model filter, so such a request ends here); otherwise Envoy's
// fallback policy picks. A request naming a LoRA adapter (loraAdapters)
// whose base model nobody serves is answered the same way, naming the
// adapter the client asked for. Out of route's line (noinline): a routed
// request never enters it.
//
//go:noinline
func (s *routerStream) noCandidate(model, adapter string) {
	p := s.plugin
	if p.servesModel(model) {
		if model != "" && !p.modelUsable(model) {
			s.modelUnavailable(model, adapter)
			return
		}
		p.stats.noCandidate.Increment(1)
		return
	}
	if adapter != "" {
		model = adapter
	}
	p.stats.notFound.Increment(1)
	p.stats.modelNotFound.Increment(1)
	s.reject(modelNotFound(model))
}

// modelUsable reports whether some candidate serving model (as
// servesModel reads it: naming it, naming no model, or listing it as an
// adapter) is healthy and has its circuit breaker closed.
func (p *routerPlugin) modelUsable(model string) bool {
	for i := range p.hosts {
		h := &p.hosts[i]
		serves := h.Model == "" || h.Model == model || len(h.Adapters) > 0 && hasAdapter(h.Adapters, model)
		if serves && !h.Unhealthy && !h.BreakerOpen {
			return true
		}
	}
	return false
}

// modelUnavailable answers a request for a model whose every host is
// unhealthy or has its circuit breaker open: 503, OpenAI-style, rather
// than let Envoy's fallback policy send it to an engine of another model
// (the healthy filter keeps unhealthy hosts only when no other candidate
// remains, and other models' hosts remain). Counted in
// requests.model_unavailable and requests.rejected (unavailable).
func (s *routerStream) modelUnavailable(model, adapter string) {
	p := s.plugin
	if adapter != "" {
		model = adapter
	}
	p.stats.unavailable.Increment(1)
	p.stats.modelUnavailable.Increment(1)
	s.reject(&openai.Error{Status: 503, Param: "model", Code: "model_unavailable", Type: "service_unavailable_error",
		Message: "The model '" + model + "' has no healthy replica right now (every engine serving it failed its health checks or has its circuit breaker open); retry later."})
}

// decideFromHeaders is the header-only mode (bodyRouting: false): no
// prompt, so affinity comes only from the session header and the optional
// client prefix-key header, whose value (prefixKey, read before the
// x-kvroute-* headers were stripped) is hashed here, in the callback that
// read it. The key is an opaque name for a prompt prefix (a hash of the
// system prompt, say), shorter than one block of prompt text: it is the
// request's one-block chain, so that the prefix scorers (prefix_home's
// home engine, the index's matches) see requests with the same key as
// sharing their prefix.
func (s *routerStream) decideFromHeaders(prefixKey string) {
	p := s.plugin
	s.streamed = true // unknown without the body: keep the first-token update
	in := dispatch.Input{SessionKey: s.sessionKey}
	if prefixKey != "" {
		p.keyChain[0] = xxhash.Sum64String(prefixKey)
		in.Chain = p.keyChain[:]
	}
	if cl, err := proxywasm.GetHttpRequestHeader("content-length"); err == nil {
		if n, err := strconv.Atoi(cl); err == nil && n > 0 {
			in.PromptTokens = n / index.DefaultCharsPerToken
		}
	}
	s.decide(&in)
}

// decide runs the strategy and writes the destination header.
func (s *routerStream) decide(in *dispatch.Input) {
	p := s.plugin
	nowMs := p.wallMs()
	t0 := p.mono()
	// One clock read for the whole decision: the index takes it too
	// (Input.NowMs) instead of reading the clock three or four times
	// (each a host call in Wasm, two through time.Now).
	in.NowMs = nowMs
	p.prepare(nowMs)
	t, res := p.disp.Decide(in, p.hosts)
	if p.reporter != nil && t.Host >= 0 {
		p.reporter.addRoute(t.Address, in.Chain, in.PromptTokens, p.disp.DecidedCharsPerToken())
	}
	p.stats.decisionMicros.Record(micros(p.mono() - t0))
	s.ticket, s.decided, s.decidedAt = t, true, t0
	s.promptTokens = in.PromptTokens
	// No defer: route cannot panic short of a bug, which the callback's
	// guard catches, and syncStats catches up with the counters next time.
	s.route(&res, nowMs, in)
	p.syncStats()
}

// route writes the decision's destination header (and the optional ones)
// and counts the dispatch.
func (s *routerStream) route(res *scorer.Result, nowMs int64, in *dispatch.Input) {
	p := s.plugin
	cfg := p.cfg // one nil check, not one per field read
	t := &s.ticket
	order := res.Decode.Order
	if len(order) == 0 {
		s.noCandidate(in.Model, in.Adapter)
		return
	}
	hosts := p.hosts
	dest := p.dest[:0]
	for i, h := range order[:min(1+cfg.Fallbacks, len(order))] {
		if i > 0 {
			dest = append(dest, ',')
		}
		addr, _ := splitRank(hosts[h].Address)
		dest = append(dest, addr...)
	}
	p.dest = dest
	s.primary = hosts[order[0]].Address
	// The host copies the value: no string copy of p.dest (see emulatedHost).
	value := unsafeString(dest)
	if p.store.emulated {
		value = string(dest)
	}
	if err := setRequestHeader(cfg.DestinationHeader, value); err != nil {
		p.destinationFailed(err)
		return
	}
	if res.Disaggregated && t.PrefillAddress != "" || cfg.ORCA {
		s.optionalHeaders(res.Disaggregated)
	}
	if _, rank := splitRank(s.primary); rank != "" {
		setRankHeader(rank)
	}
	p.breakers.Dispatched(s.primary, nowMs)
	p.stats.routed.Increment(1)
	p.profileCounter(res.Decode.Profile).Increment(1)
	p.modelCounter(in.Model).Increment(1)
	if t.PredictedCachedTokens > 0 {
		p.stats.predictedCached.Increment(uint64(t.PredictedCachedTokens))
	}
	if s.promptTokens > 0 {
		p.stats.promptTokens.Increment(uint64(s.promptTokens))
	}
	if cfg.DebugHeader != "" {
		s.explain(res, t.PredictedCachedTokens)
	}
}

// optionalHeaders writes the request headers a decision adds only in some
// deployments: the prefill host of a disaggregated decision and the ORCA
// format request. Out of route's line: each function entered costs a request
// (docs/performance.md), and the default configuration needs neither.
func (s *routerStream) optionalHeaders(disaggregated bool) {
	if addr := s.ticket.PrefillAddress; disaggregated && addr != "" {
		// kvroute.pd (after the router in the chain) prefills there.
		_ = proxywasm.ReplaceHttpRequestHeader(PrefillHostHeader, s.plugin.prefillLocation(addr))
	}
	if s.plugin.cfg.ORCA {
		_ = proxywasm.ReplaceHttpRequestHeader(health.ORCAFormatHeader, "TEXT")
	}
}

// destinationFailed logs a destination header the host would not take. Out of
// line, like every rare branch of the request path: each function entered
// costs a request (docs/performance.md), and a log call's arguments are boxed
// into interfaces in place (hence noinline).
//
//go:noinline
func (p *routerPlugin) destinationFailed(err error) {
	proxywasm.LogWarnf("kvroute.router: setting %s: %v", p.cfg.DestinationHeader, err)
}

// explain writes the debug header's decision explanation: addresses,
// scores, matched blocks and plugin names only, never prompt text (the
// router's own request state carries the matches).
func (s *routerStream) explain(res *scorer.Result, predicted int) {
	p := s.plugin
	b := p.disp.AppendExplain(nil, res, p.hosts)
	b = append(b, " predicted_cached_tokens="...)
	s.explanation = string(strconv.AppendInt(b, int64(predicted), 10))
}
