package filter

import (
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/filter/hostbuf"
	"github.com/kvroute/kvroute/filter/quietbody"
	"github.com/kvroute/kvroute/health"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/scorer"
)

func (s *routerStream) OnHttpResponseHeaders(_ int, endOfStream bool) (action types.Action) {
	p := s.plugin
	defer guard(&p.stats.recoveredPanics, "kvroute.router on_response_headers", &action, nil)
	if !s.decided || s.primary == "" {
		return types.ActionContinue
	}
	// The time to first byte only when something reads it (see
	// timeResponses): otherwise no clock is read.
	var latencyMs float64
	if p.timeResponses {
		latencyMs = millis(p.mono() - s.decidedAt)
	}
	status, served := p.responseStatusAndPeer(s.primary)
	if served != s.primary {
		p.fellBack(s.primary, served)
	}
	ok := status > 0 && status < 500
	if th := p.cfg.CircuitBreaker.LatencyThresholdMs; th > 0 && latencyMs > float64(th) {
		ok = false
	}
	// A success while no host is failing changes nothing.
	if !ok || p.breakers.Failing() {
		s.breakerResult(served, ok, status, latencyMs)
	}
	if p.timeResponses || p.cfg.ORCA {
		p.learnHost(served, s.ticket.Host, latencyMs)
	}
	if s.explanation != "" {
		_ = proxywasm.ReplaceHttpResponseHeader(p.cfg.DebugHeader, s.explanation)
	}
	if endOfStream {
		p.disp.FirstToken(&s.ticket)
	}
	return types.ActionContinue
}

// The response path's rare branches live in their own functions so that
// OnHttpResponseHeaders stays small: each function entered costs a request
// (docs/performance.md).

// fellBack records that override_host moved on from primary to served: the
// primary refused the connection.
func (p *routerPlugin) fellBack(primary, served string) {
	if _, known := p.pos[served]; !known {
		return
	}
	p.stats.fallbacksUsed.Increment(1)
	if p.breakers.Result(primary, false, p.now().UnixMilli()) {
		p.stats.breakerOpened.Increment(1)
	}
}

// breakerResult records a response's outcome with served's breaker, and
// counts and logs the breaker when the outcome opens it. It reads the wall
// clock, which only a breaker with something to record needs, and the
// response time for the log line when the response was not timed. Out of
// line (noinline): inlined, the clock's conversion to milliseconds and the
// log call's boxing would be code every response enters.
//
//go:noinline
func (s *routerStream) breakerResult(served string, ok bool, status int, latencyMs float64) {
	p := s.plugin
	if !p.breakers.Result(served, ok, p.now().UnixMilli()) {
		return
	}
	p.stats.breakerOpened.Increment(1)
	if !p.timeResponses {
		latencyMs = millis(p.mono() - s.decidedAt)
	}
	proxywasm.LogWarnf("kvroute.router: circuit breaker opened for %s (status %d, %.0f ms)", served, status, latencyMs)
}

// learnHost takes what a response tells about the host that served it:
// its time to first byte into the host's latency EWMA (when responses are
// timed) and its ORCA load report (with orca on). hint is the primary's
// position at the decision.
func (p *routerPlugin) learnHost(served string, hint int, latencyMs float64) {
	i := hint
	if i < 0 || i >= len(p.hosts) || p.hosts[i].Address != served {
		// Another host answered, or the candidates changed since.
		if i = p.lookupHost(served); i < 0 {
			return
		}
	}
	h := &p.hosts[i]
	if p.timeResponses {
		if h.LatencyEWMAMs == 0 {
			h.LatencyEWMAMs = latencyMs
		} else {
			h.LatencyEWMAMs = 0.8*h.LatencyEWMAMs + 0.2*latencyMs
		}
	}
	if p.cfg.ORCA {
		p.readORCA(h)
	}
}

// readORCA takes the engine's load from the response's ORCA header.
func (p *routerPlugin) readORCA(h *scorer.Host) {
	hostbuf.Lend(p.hostVal)
	v, err := proxywasm.GetHttpResponseHeader(health.ORCAHeader)
	hostbuf.Lend(nil)
	if err != nil {
		return
	}
	if l := health.ParseORCA(v); l.OK {
		h.KVUsage, h.Waiting, h.Running = l.KVUsage, l.Waiting, l.Running
	}
}

// lookupHost is the position of addr in p.hosts, -1 for a host outside
// the candidate set. Out of line (noinline): learnHost asks only when the
// host that answered is not the decision's (a fallback, or the candidates
// changed), and inlined, the map lookup's call would be code every
// response it learns from enters.
//
//go:noinline
func (p *routerPlugin) lookupHost(addr string) int {
	if i, known := p.pos[addr]; known {
		return i
	}
	return -1
}

func (s *routerStream) OnHttpResponseBody(bodySize int, endOfStream bool) (action types.Action) {
	p := s.plugin
	defer guard(&p.stats.recoveredPanics, "kvroute.router on_response_body", &action, nil)
	if !s.decided {
		return types.ActionContinue
	}
	if !s.firstByte {
		s.firstByte = true
		// The end of prefill, for a streamed response. A non-streamed one
		// sends its first byte only once the whole completion is done, so
		// its first chunk says nothing the last one will not say a moment
		// later: finish takes everything back at once, one update of the
		// shared load counters instead of two. Envoy's HTTP/1 codec
		// delivers even a one-read body as a chunk and then an empty last
		// one, so this is most non-streamed responses.
		if !endOfStream && s.streamed {
			if p.timeFirstToken {
				// A streamed response's first chunk is its first token
				// (the headers may come before it).
				s.ticket.TTFTMs = millis(p.mono() - s.decidedAt)
			}
			p.disp.FirstToken(&s.ticket)
		}
		if s.noUsage && !endOfStream {
			// Nothing to read before the last chunk: the bridge answers
			// the chunks in between itself.
			quietbody.Mark(s.id)
		}
	}
	// The engine's cached_tokens report, read from the chunk; the last one
	// wins (a stream's final chunk). A stream that did not ask for usage
	// has none to read: its chunks (one per token or so) are not read.
	if bodySize > 0 && !s.noUsage {
		if chunk, err := p.readBuffer(bodySize, bufferResponseBody, proxywasm.GetHttpResponseBody); err == nil {
			if n, ok := openai.CachedTokens(s.tail.Bytes(), chunk); ok {
				s.cached, s.feedbackSet = n, true
				// The same usage object's prompt_tokens, when the chunk
				// holds it and the router samples this request: the
				// model's characters per token.
				if s.ticket.SampleUsage() {
					s.ticket.EnginePromptTokens, _ = openai.PromptTokens(chunk)
				}
			}
			if !endOfStream {
				s.tail.Keep(chunk)
			}
		}
		if s.probeUsage {
			s.stopUnlessUsage(endOfStream)
		}
	}
	// Not deferred: a panic in the scan leaves finish to stream done.
	if endOfStream && !s.finished {
		s.finish()
	}
	return types.ActionContinue
}

// stopUnlessUsage ends the probe of a stream that asked only for
// continuous_usage_stats: when its first chunk carried no cached_tokens,
// the engine ignores the option (or reports no cache hits in it), and the
// chunks that follow, one per token or so, are not read. Out of line
// (noinline): in Wasm only such streams enter it.
//
//go:noinline
func (s *routerStream) stopUnlessUsage(endOfStream bool) {
	s.probeUsage = false
	if !s.feedbackSet && !endOfStream {
		s.noUsage = true
		quietbody.Mark(s.id)
	}
}

// finish gives the engine's feedback to the router, releases the request's
// load and brings the metrics up to date with what the request changed
// (syncStats). Callers check s.finished first: it runs once, at the
// response's last body chunk, or at stream done for a response that ended
// without one (headers only, a reset). A one-chunk response so skips the
// separate first-token update (one read-modify-write of the shared load
// counters instead of two), and the stream done that follows has nothing
// left to do.
func (s *routerStream) finish() {
	s.finished = true
	p := s.plugin
	cached := -1 // Finish's "no feedback"
	if s.feedbackSet {
		cached = s.cached
		if s.promptTokens > 0 {
			p.stats.feedbackPromptTokens.Increment(uint64(s.promptTokens))
		}
	}
	p.disp.Finish(&s.ticket, cached)
	p.syncStats()
}

// OnHttpStreamDone ends what the stream still holds: an admission place, and
// for a routed response that ended without its last body chunk, the feedback
// and load that finish gives back. A stream finish already ended, as nearly
// every routed one is, leaves nothing to do: the callback then enters no other
// function, and the guard (a deferred recover) sits in streamDone with the
// work it protects. Each function entered costs a request
// (docs/performance.md).
func (s *routerStream) OnHttpStreamDone() {
	if s.plugin.adm != nil || s.decided && !s.finished {
		s.streamDone()
	}
}

// streamDone is OnHttpStreamDone's work. A finished stream has had its
// first byte (finish runs at the last body chunk or here), so only an
// unfinished one can leave a half-open probe to release.
func (s *routerStream) streamDone() {
	p := s.plugin
	defer guard(&p.stats.recoveredPanics, "kvroute.router on_stream_done", nil, nil)
	if p.adm != nil {
		p.adm.streamDone(s)
	}
	if !s.decided || s.finished {
		return
	}
	s.finish()
	if !s.firstByte && s.primary != "" {
		p.breakers.Abandoned(s.primary)
	}
}
