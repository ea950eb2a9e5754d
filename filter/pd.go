package filter

import (
	"strconv"
	"strings"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/filter/statnames"
	"github.com/kvroute/kvroute/openai"
)

// kvroute.pd turns one client request into prefill on one pod, then decode
// on another, while the client sees one ordinary response.
//
// It sits after kvroute.router in the filter chain and acts only on requests
// the router disaggregated: the router names the prefill host in
// PrefillHostHeader (the decode host stays in the destination header).
// The router strips every client-supplied x-kvroute-* header, so the header
// can only come from it. kvroute.pd then:
//
//   - vLLM (NixlConnector): sends a prefill-only copy of the body (max_tokens
//     1, no streaming, kv_transfer_params do_remote_decode) to the prefill
//     host with dispatch_http_call, holds the request meanwhile, copies the
//     prefill response's kv_transfer_params, untouched, into the original
//     body and resumes: the decode host pulls the KV cache and streams the
//     answer back on the main stream (callout responses are buffered, so
//     the decode must not be a callout).
//   - SGLang: adds bootstrap_host, bootstrap_port and a random 63-bit
//     bootstrap_room to the body, fires the same body at the prefill host
//     and resumes to the decode host at once: the two servers pair up by
//     the room.
//
// A prefill that fails, times out or answers without kv_transfer_params
// costs only the split: the request goes to the decode host alone, which
// prefills itself. Every outcome is counted and named in a response header
// (config.PD.MarkerHeader), and no client ever gets a 5xx only because
// prefill failed. SGLang's decode runs concurrently with its prefill, so a
// late prefill failure is repaired by re-sending the request decode-only as
// a callout and answering with its (buffered) response.
//
// Reading the body while the headers wait needs Envoy's
// allow_on_headers_stop_iteration (>= 1.35); without it Envoy holds the body
// back until the filter resumes, and the request would hang.

// PrefillHostHeader is the internal request header by which
// kvroute.router hands kvroute.pd the prefill host: "host:port", optionally
// followed by fallbacks (comma-separated, retry order). kvroute.pd removes it
// before the request goes upstream. (The router spells it
// internalHeaderPrefix + "prefill-host".)
const PrefillHostHeader = "x-kvroute-prefill-host"

// Outcomes named in the marker header.
const (
	pdMarkRemote    = "prefill=remote"
	pdMarkBootstrap = "prefill=bootstrap"
	pdFallbackPref  = "fallback="
)

// Fallback reasons (marker "fallback=<reason>" and metric
// kvroute.pd.fallbacks with the tag kvroute_reason).
const (
	reasonError     = "prefill_error"     // non-200 answer or reset
	reasonTimeout   = "prefill_timeout"   // no answer within pd.timeoutMs
	reasonMalformed = "prefill_malformed" // 200 without a kv_transfer_params object
	reasonDispatch  = "dispatch_failed"   // the callout could not be sent (unknown cluster, ...)
	reasonBody      = "bad_body"          // the request body is not a JSON object
	reasonPanic     = "recovered_panic"
	reasonNoBody    = "no_body" // the body never reached the filter: allow_on_headers_stop_iteration is off
)

// pdBodyWait is how long a request may wait, headers held, for its body.
// Behind kvroute.router the body arrives with the headers (the router
// buffered it), so a longer wait means Envoy holds the body back: the plugin
// lacks allow_on_headers_stop_iteration. The request then goes on
// decode-only instead of hanging until the stream times out.
const pdBodyWait = 2 * time.Second

// pdTickMs is the root tick that looks for such requests.
const pdTickMs = 500

// envoyTimeoutBody is the body of the 504 Envoy's async client answers
// when a callout times out.
const envoyTimeoutBody = "upstream request timeout"

// pdPlugin is the kvroute.pd root.
type pdPlugin struct {
	cfg   *config.Config
	pd    config.PD
	stats pdStats
	// held are the streams whose headers wait for the body, by context id.
	held     map[uint32]*pdStream
	bodyWait time.Duration
	now      func() time.Time // Options.Clock, or time.Now
	warned   bool             // the allow_on_headers_stop_iteration error was logged
	// reader lists the members of each client body (its buffers are this
	// worker's, kept for the next body).
	reader openai.ObjectReader
}

type pdStats struct {
	commonStats
	// disaggregated: prefill went to the prefill host (vLLM: its
	// kv_transfer_params reached the decode request; SGLang: the pair was
	// sent; a prefill failure noticed later is counted as a fallback too).
	disaggregated metricCounter
	// passthrough: the router did not disaggregate; the request is untouched.
	passthrough metricCounter
	// fallbacks by reason: the request went (or was re-sent) decode-only.
	fallbacks map[string]metricCounter
	// lateFallbacks: SGLang requests re-sent decode-only as a callout
	// because the prefill failed after the decode request had left.
	lateFallbacks metricCounter
	// fallbackFailed: that decode-only callout failed too; the client got
	// the decode's own answer.
	fallbackFailed metricCounter
	// prefillMicros is the prefill callout's duration, success or not: the
	// TTFT the split adds before the decode starts (vLLM), or the prefill
	// peer's time (SGLang).
	prefillMicros metricHistogram
}

func newPD(cfg *config.Config, opts Options) (*pdPlugin, error) {
	p := &pdPlugin{cfg: cfg, pd: cfg.PD, held: map[uint32]*pdStream{}, bodyWait: pdBodyWait, now: opts.clock()}
	if opts.PDBodyWait > 0 {
		p.bodyWait = opts.PDBodyWait
	}
	p.stats = pdStats{
		commonStats:    newCommonStats(statnames.PD),
		disaggregated:  defineCounter(statnames.PD + "requests.disaggregated"),
		passthrough:    defineCounter(statnames.PD + "requests.passthrough"),
		lateFallbacks:  defineCounter(statnames.PD + "requests.late_fallback"),
		fallbackFailed: defineCounter(statnames.PD + "requests.fallback_failed"),
		fallbacks:      map[string]metricCounter{},
		prefillMicros:  defineHistogram(statnames.PD + "prefill_us"),
	}
	for _, r := range []string{reasonError, reasonTimeout, reasonMalformed, reasonDispatch, reasonBody, reasonPanic, reasonNoBody} {
		p.stats.fallbacks[r] = defineCounter(statnames.Tagged(statnames.PD, statnames.TagReason, r, "fallbacks"))
	}
	if err := proxywasm.SetTickPeriodMilliSeconds(pdTickMs); err != nil {
		proxywasm.LogWarnf("kvroute.pd: setting the tick period: %v (requests whose body never arrives will wait for Envoy's stream timeout)", err)
	}
	return p, nil
}

func (p *pdPlugin) newStream(id uint32) types.HttpContext { return &pdStream{plugin: p, id: id} }

// onTick sends on, decode-only, every request whose headers have waited
// for a body longer than bodyWait (see pdBodyWait).
func (p *pdPlugin) onTick() {
	defer guard(&p.stats.recoveredPanics, "kvroute.pd on_tick", nil, nil)
	now := p.now()
	for id, s := range p.held {
		if now.Sub(s.heldAt) < p.bodyWait {
			continue
		}
		delete(p.held, id)
		if s.done || s.phase != phaseBuffering {
			continue
		}
		if err := proxywasm.SetEffectiveContext(id); err != nil {
			continue
		}
		if !p.warned {
			p.warned = true
			proxywasm.LogErrorf("kvroute.pd: no request body reached the filter within %v of the headers: "+
				"set allow_on_headers_stop_iteration: true on the kvroute.pd plugin (Envoy >= 1.35); until then requests go decode-only", p.bodyWait)
		}
		s.phase = phaseResumed
		s.fallback(reasonNoBody)
		if err := proxywasm.ResumeHttpRequest(); err != nil {
			proxywasm.LogWarnf("kvroute.pd: resuming a request that had no body: %v", err)
		}
	}
}

// pdPhase is where a disaggregated stream is.
type pdPhase uint8

const (
	phaseIdle       pdPhase = iota // not disaggregated (or not yet known)
	phaseBuffering                 // headers held, reading the body
	phasePrefilling                // vLLM: request held until the prefill answers
	phaseResumed                   // the request went on to the decode host
)

// sglPrefill is the SGLang prefill callout's state.
type sglPrefill uint8

const (
	sglNone sglPrefill = iota
	sglPending
	sglOK
	sglFailed
)

// pdStream is one request through kvroute.pd.
type pdStream struct {
	types.DefaultHttpContext
	plugin *pdPlugin
	id     uint32
	heldAt time.Time

	phase   pdPhase
	done    bool   // stream over: late callbacks do nothing
	prefill string // the router's prefill address list
	decode  string // the destination header (decode hosts)
	// The prefill host's data-parallel rank and its endpoint's rank count
	// ("" and 0 without ranks), and the decode's rank, the router's
	// x-data-parallel-rank: each hop names its own rank.
	prefillRank, decodeRank string
	prefillRanks            int

	hasCL   bool // the request carries content-length (kept exact)
	headers [][2]string
	body    []byte          // the client's body, for the request and the fallbacks
	members []openai.Member // its top-level members (aliasing body)
	sent    time.Time
	marker  string

	// SGLang only.
	sgl          sglPrefill
	respSeen     bool // the decode's response headers arrived
	respHeld     bool // ... and are held: a 5xx while the prefill is unsettled
	respEOS      bool // the held response body is complete
	fallbackSent bool
	replacement  *calloutResponse // decode-only answer waiting for respEOS
}

// calloutResponse is a buffered callout answer.
type calloutResponse struct {
	status  int
	headers [][2]string
	body    []byte
}

func (s *pdStream) stats() *pdStats { return &s.plugin.stats }

func (s *pdStream) OnHttpRequestHeaders(_ int, endOfStream bool) (action types.Action) {
	defer guard(&s.stats().recoveredPanics, "kvroute.pd on_request_headers", &action, s.failOpenInline)
	hs, err := proxywasm.GetHttpRequestHeaders()
	if err != nil {
		proxywasm.LogWarnf("kvroute.pd: reading request headers: %v", err)
		return types.ActionContinue
	}
	var hook, path string
	dest := s.plugin.cfg.DestinationHeader
	s.headers = s.headers[:0]
	for _, h := range hs {
		name := strings.ToLower(h[0])
		switch {
		case name == PrefillHostHeader:
			s.prefill = strings.TrimSpace(h[1])
			continue
		case name == testPanicHeader:
			hook = h[1]
		case name == ":path":
			path = h[1]
		case name == dest:
			s.decode = h[1]
			continue
		case name == DataParallelRankHeader:
			s.decodeRank = h[1] // the router's, for the decode host only
			continue
		case name == "content-length":
			s.hasCL = true
			continue
		case hopByHopHeader(name):
			continue
		}
		s.headers = append(s.headers, [2]string{name, h[1]})
	}
	testPanic(s.plugin.cfg.TestHooks, hook)
	if s.prefill != "" {
		if err := proxywasm.RemoveHttpRequestHeader(PrefillHostHeader); err != nil {
			proxywasm.LogWarnf("kvroute.pd: removing %s: %v", PrefillHostHeader, err)
		}
		s.prefill, s.prefillRank, s.prefillRanks = prefillTarget(s.prefill)
	}
	if s.prefill == "" || !generates(path) {
		// Not split by the router, or nothing to decode (embeddings, ...).
		s.prefill = ""
		s.stats().passthrough.Increment(1)
		return types.ActionContinue
	}
	if endOfStream {
		// Nothing to prefill: a body-less request goes on as it is.
		s.fallback(reasonBody)
		return types.ActionContinue
	}
	s.phase = phaseBuffering
	s.heldAt = s.plugin.now()
	s.plugin.held[s.id] = s
	return types.ActionPause
}

func (s *pdStream) OnHttpRequestBody(bodySize int, endOfStream bool) (action types.Action) {
	defer guard(&s.stats().recoveredPanics, "kvroute.pd on_request_body", &action, s.failOpenInline)
	delete(s.plugin.held, s.id)
	if s.phase != phaseBuffering {
		return types.ActionContinue
	}
	if !endOfStream {
		return types.ActionPause
	}
	body, err := proxywasm.GetHttpRequestBody(0, bodySize)
	if err != nil {
		proxywasm.LogWarnf("kvroute.pd: reading the request body: %v", err)
		s.phase = phaseResumed
		s.fallback(reasonBody)
		return types.ActionContinue
	}
	s.body = body
	ms, ok := s.plugin.reader.Members(body)
	if !ok {
		s.phase = phaseResumed
		s.fallback(reasonBody)
		return types.ActionContinue
	}
	s.members = ms
	if s.plugin.pd.Protocol == config.PDProtocolSGLang {
		action = s.startSGLang()
	} else {
		action = s.startVLLM()
	}
	if action == types.ActionContinue {
		s.phase = phaseResumed
	}
	return action
}

// callHeaders are the client's request headers for a callout to the host
// list dest (content-length, accept-encoding and hop-by-hop headers dropped,
// x-request-id and credentials kept), with the destination header naming
// dest and x-data-parallel-rank naming rank, that host's data-parallel rank
// (none when ""; never the other hop's).
func (s *pdStream) callHeaders(dest, rank string, bodyLen int) [][2]string {
	hs := make([][2]string, 0, len(s.headers)+3)
	for _, h := range s.headers {
		// kvroute.pd reads the answer: ask for it uncompressed.
		if h[0] != "accept-encoding" {
			hs = append(hs, h)
		}
	}
	hs = append(hs, [2]string{s.plugin.cfg.DestinationHeader, dest}, [2]string{"content-length", strconv.Itoa(bodyLen)})
	if rank != "" {
		hs = append(hs, [2]string{DataParallelRankHeader, rank})
	}
	return hs
}

// startVLLM dispatches the prefill-only request and holds the main one.
func (s *pdStream) startVLLM() types.Action {
	pb := openai.VLLMPrefillBody(s.members)
	pd := &s.plugin.pd
	_, err := proxywasm.DispatchHttpCall(pd.PrefillCluster, s.callHeaders(s.prefill, s.prefillRank, len(pb)), pb, nil, uint32(pd.TimeoutMs), s.onVLLMPrefill)
	if err != nil {
		proxywasm.LogWarnf("kvroute.pd: dispatching the prefill to cluster %q: %v (check pd.prefillCluster)", pd.PrefillCluster, err)
		s.fallback(reasonDispatch)
		return types.ActionContinue
	}
	s.sent = s.plugin.now()
	s.phase = phasePrefilling
	return types.ActionPause
}

// onVLLMPrefill receives the prefill answer: decode with its
// kv_transfer_params, or decode-only.
func (s *pdStream) onVLLMPrefill(numHeaders, bodySize, _ int) {
	defer guard(&s.stats().recoveredPanics, "kvroute.pd prefill response", nil, s.failOpenHeld)
	if s.done || s.phase != phasePrefilling {
		return
	}
	resp, reason := s.readPrefill(numHeaders, bodySize)
	if reason != "" {
		s.fallback(reason)
		s.resume()
		return
	}
	kv, ok := openai.KVTransferParams(resp.body)
	if !ok {
		s.fallback(reasonMalformed)
		s.resume()
		return
	}
	body := openai.WithKVTransferParams(s.members, kv)
	if err := proxywasm.ReplaceHttpRequestBody(body); err != nil {
		proxywasm.LogWarnf("kvroute.pd: replacing the request body: %v", err)
		s.fallback(reasonError)
		s.resume()
		return
	}
	s.setContentLength(len(body))
	s.marker = pdMarkRemote
	s.stats().disaggregated.Increment(1)
	s.resume()
}

// readPrefill reads a prefill callout answer and classifies a failure.
func (s *pdStream) readPrefill(numHeaders, bodySize int) (*calloutResponse, string) {
	took := s.plugin.now().Sub(s.sent)
	s.stats().prefillMicros.Record(uint64(took.Microseconds()))
	if numHeaders == 0 {
		return nil, reasonError // reset
	}
	resp := readCallout(bodySize)
	if resp.status == 200 {
		return resp, ""
	}
	if resp.status == 504 && (string(resp.body) == envoyTimeoutBody ||
		took >= time.Duration(s.plugin.pd.TimeoutMs)*time.Millisecond*9/10) {
		return resp, reasonTimeout
	}
	return resp, reasonError
}

func readCallout(bodySize int) *calloutResponse {
	r := &calloutResponse{}
	hs, _ := proxywasm.GetHttpCallResponseHeaders()
	for _, h := range hs {
		if h[0] == ":status" {
			r.status, _ = strconv.Atoi(h[1])
			continue
		}
		r.headers = append(r.headers, h)
	}
	if bodySize > 0 {
		r.body, _ = proxywasm.GetHttpCallResponseBody(0, bodySize)
	}
	return r
}

// startSGLang sends the bootstrap pair: the prefill callout, and the main
// request on to the decode host at once.
func (s *pdStream) startSGLang() types.Action {
	pd := &s.plugin.pd
	first := s.prefill
	if i := strings.IndexByte(first, ','); i >= 0 {
		// bootstrap_host must be the host that prefills: no retry list.
		first = strings.TrimSpace(first[:i])
	}
	host, port, ok := openai.SplitAddress(first)
	if !ok {
		proxywasm.LogWarnf("kvroute.pd: prefill endpoint %q is not host:port", first)
		s.fallback(reasonDispatch)
		return types.ActionContinue
	}
	if pd.BootstrapPort != 0 {
		port = pd.BootstrapPort
	}
	room := openai.BootstrapRoom()
	if s.prefillRanks > 1 {
		// SGLang's prefill takes the request on rank room % size and its
		// decode fetches the KV from that rank: a room that names the rank
		// the router chose.
		r, _ := strconv.Atoi(s.prefillRank)
		room >>= 1 // 62 bits, so that adding the rank stays within 63
		room = room - room%uint64(s.prefillRanks) + uint64(r)
	}
	body := openai.WithBootstrap(s.members, host, port, room)
	_, err := proxywasm.DispatchHttpCall(pd.PrefillCluster, s.callHeaders(first, s.prefillRank, len(body)), body, nil, uint32(pd.TimeoutMs), s.onSGLangPrefill)
	if err != nil {
		proxywasm.LogWarnf("kvroute.pd: dispatching the prefill to cluster %q: %v (check pd.prefillCluster)", pd.PrefillCluster, err)
		s.fallback(reasonDispatch)
		return types.ActionContinue
	}
	s.sent = s.plugin.now()
	s.sgl = sglPending
	if err := proxywasm.ReplaceHttpRequestBody(body); err != nil {
		// The prefill is on its way but the decode would not pair with it;
		// the decode prefills itself.
		proxywasm.LogWarnf("kvroute.pd: replacing the request body: %v", err)
		s.sgl = sglFailed
		s.fallback(reasonError)
		return types.ActionContinue
	}
	s.setContentLength(len(body))
	s.marker = pdMarkBootstrap
	s.phase = phaseResumed
	// Counted when the pair leaves: the prefill's answer may come after the
	// stream has ended, when no callback runs any more.
	s.stats().disaggregated.Increment(1)
	return types.ActionContinue
}

// onSGLangPrefill settles the prefill. A failure while the decode's answer
// is not yet on its way to the client is repaired decode-only.
func (s *pdStream) onSGLangPrefill(numHeaders, bodySize, _ int) {
	defer guard(&s.stats().recoveredPanics, "kvroute.pd prefill response", nil, nil)
	if s.done || s.sgl != sglPending {
		return
	}
	_, reason := s.readPrefill(numHeaders, bodySize)
	if reason == "" {
		s.sgl = sglOK
		if s.respHeld {
			// The decode failed on its own account: pass its answer on.
			s.releaseResponse()
		}
		return
	}
	s.sgl = sglFailed
	if s.respSeen && !s.respHeld {
		// The decode's answer is already streaming to the client: nothing
		// left to repair.
		s.countFallback(reason)
		proxywasm.LogWarnf("kvroute.pd: SGLang prefill failed (%s) after the decode response started", reason)
		return
	}
	s.marker = pdFallbackPref + reason
	s.countFallback(reason)
	s.sendDecodeOnly()
}

// sendDecodeOnly re-sends the client's body, without bootstrap fields, to
// the decode host as a callout.
func (s *pdStream) sendDecodeOnly() {
	pd := &s.plugin.pd
	dest := s.decode
	s.fallbackSent = true
	_, err := proxywasm.DispatchHttpCall(pd.DecodeCluster, s.callHeaders(dest, s.decodeRank, len(s.body)), s.body, nil, uint32(pd.FallbackTimeoutMs), s.onDecodeOnly)
	if err != nil {
		proxywasm.LogWarnf("kvroute.pd: dispatching the decode-only fallback to cluster %q: %v (check pd.decodeCluster)", pd.DecodeCluster, err)
		s.stats().fallbackFailed.Increment(1)
		s.fallbackSent = false
		if s.respHeld {
			s.releaseResponse()
		}
		return
	}
	s.stats().lateFallbacks.Increment(1)
}

func (s *pdStream) onDecodeOnly(numHeaders, bodySize, _ int) {
	defer guard(&s.stats().recoveredPanics, "kvroute.pd decode-only response", nil, nil)
	if s.done {
		return
	}
	s.fallbackSent = false
	if numHeaders == 0 {
		s.stats().fallbackFailed.Increment(1)
		if s.respHeld {
			s.releaseResponse()
		} else if !s.respSeen {
			s.localReply(&calloutResponse{status: 503, body: []byte("decode-only fallback reset")})
		}
		return
	}
	r := readCallout(bodySize)
	switch {
	case s.respHeld && s.respEOS:
		s.replaceResponse(r)
	case s.respHeld:
		s.replacement = r
	case !s.respSeen:
		s.localReply(r)
	}
}

// OnHttpResponseHeaders marks the response and, for SGLang, holds a decode
// failure until the prefill's fate is known.
func (s *pdStream) OnHttpResponseHeaders(int, bool) (action types.Action) {
	defer guard(&s.stats().recoveredPanics, "kvroute.pd on_response_headers", &action, nil)
	if s.marker == "" || s.done {
		return types.ActionContinue
	}
	s.respSeen = true
	if s.sgl == sglPending || s.sgl == sglFailed && s.fallbackSent {
		status, _ := proxywasm.GetHttpResponseHeader(":status")
		if code, _ := strconv.Atoi(status); code >= 500 {
			s.respHeld = true
			return types.ActionPause
		}
	}
	s.addMarker()
	return types.ActionContinue
}

func (s *pdStream) OnHttpResponseBody(_ int, endOfStream bool) (action types.Action) {
	defer guard(&s.stats().recoveredPanics, "kvroute.pd on_response_body", &action, nil)
	if !s.respHeld {
		return types.ActionContinue
	}
	if !endOfStream {
		return types.ActionPause
	}
	s.respEOS = true
	if r := s.replacement; r != nil {
		s.replacement = nil
		s.rewriteResponse(r)
		return types.ActionContinue
	}
	return types.ActionPause
}

func (s *pdStream) OnHttpStreamDone() {
	defer guard(&s.stats().recoveredPanics, "kvroute.pd on_stream_done", nil, nil)
	s.done = true
	delete(s.plugin.held, s.id)
}

func (s *pdStream) addMarker() {
	if h := s.plugin.pd.MarkerHeader; h != "" && s.marker != "" {
		if err := proxywasm.ReplaceHttpResponseHeader(h, s.marker); err != nil {
			proxywasm.LogDebugf("kvroute.pd: setting %s: %v", h, err)
		}
	}
}

// releaseResponse lets a held decode answer through unchanged.
func (s *pdStream) releaseResponse() {
	s.respHeld = false
	s.addMarker()
	if err := proxywasm.ResumeHttpResponse(); err != nil {
		proxywasm.LogWarnf("kvroute.pd: resuming the response: %v", err)
	}
}

// replaceResponse swaps a held decode failure for the decode-only answer.
func (s *pdStream) replaceResponse(r *calloutResponse) {
	s.rewriteResponse(r)
	if err := proxywasm.ResumeHttpResponse(); err != nil {
		proxywasm.LogWarnf("kvroute.pd: resuming the response: %v", err)
	}
}

func (s *pdStream) rewriteResponse(r *calloutResponse) {
	s.respHeld = false
	if err := proxywasm.ReplaceHttpResponseHeaders(s.replyHeaders(r, true)); err != nil {
		proxywasm.LogWarnf("kvroute.pd: replacing the response headers: %v", err)
	}
	if err := proxywasm.ReplaceHttpResponseBody(r.body); err != nil {
		proxywasm.LogWarnf("kvroute.pd: replacing the response body: %v", err)
	}
}

// replyHeaders are a callout answer's headers as the client's response.
func (s *pdStream) replyHeaders(r *calloutResponse, withStatus bool) [][2]string {
	hs := make([][2]string, 0, len(r.headers)+3)
	if withStatus {
		hs = append(hs, [2]string{":status", strconv.Itoa(r.status)})
	}
	for _, h := range r.headers {
		name := strings.ToLower(h[0])
		if name == "content-length" || hopByHopHeader(name) || name == s.plugin.pd.MarkerHeader {
			continue
		}
		hs = append(hs, h)
	}
	hs = append(hs, [2]string{"content-length", strconv.Itoa(len(r.body))})
	if h := s.plugin.pd.MarkerHeader; h != "" && s.marker != "" {
		hs = append(hs, [2]string{h, s.marker})
	}
	return hs
}

func (s *pdStream) localReply(r *calloutResponse) {
	if r.status == 0 {
		r.status = 502
	}
	if err := proxywasm.SendHttpResponse(uint32(r.status), s.replyHeaders(r, false), r.body, -1); err != nil {
		proxywasm.LogWarnf("kvroute.pd: sending the decode-only answer: %v", err)
	}
}

// fallback sends the request decode-only, as the client sent it.
func (s *pdStream) fallback(reason string) {
	s.marker = pdFallbackPref + reason
	s.countFallback(reason)
}

func (s *pdStream) countFallback(reason string) {
	if c, ok := s.stats().fallbacks[reason]; ok {
		c.Increment(1)
	}
}

// resume sends the held request on.
func (s *pdStream) resume() {
	if s.phase == phaseResumed {
		return
	}
	s.phase = phaseResumed
	if err := proxywasm.ResumeHttpRequest(); err != nil {
		proxywasm.LogWarnf("kvroute.pd: resuming the request: %v", err)
	}
}

// failOpenInline runs after a panic recovered in a request callback, whose
// guard continues the stream: the request goes on decode-only (the body is
// untouched until the last step). A prefill already dispatched is ignored.
func (s *pdStream) failOpenInline() {
	if s.prefill == "" || s.phase == phaseResumed {
		return
	}
	s.phase = phaseResumed
	s.fallback(reasonPanic)
}

// failOpenHeld runs after a panic recovered in the prefill callback: the
// held request goes on decode-only.
func (s *pdStream) failOpenHeld() {
	if s.phase != phasePrefilling {
		return
	}
	s.fallback(reasonPanic)
	s.resume()
}

func (s *pdStream) setContentLength(n int) {
	if !s.hasCL {
		return
	}
	if err := proxywasm.ReplaceHttpRequestHeader("content-length", strconv.Itoa(n)); err != nil {
		proxywasm.LogWarnf("kvroute.pd: setting content-length: %v", err)
	}
}

// generates reports whether path is an OpenAI endpoint that generates
// tokens (completions, chat completions): only those have a decode phase.
func generates(path string) bool {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	return strings.HasSuffix(path, "/completions")
}

// hopByHopHeader reports the headers a proxy never forwards as they are.
func hopByHopHeader(name string) bool {
	switch name {
	case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade":
		return true
	}
	return false
}
