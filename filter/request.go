package filter

import (
	"strconv"
	"strings"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/dispatch"
	"github.com/kvroute/kvroute/openai"
)

func (s *routerStream) OnHttpRequestHeaders(_ int, endOfStream bool) (action types.Action) {
	// One defer and one return, as in OnHttpRequestBody: handleRequestHeaders'
	// many returns would each carry a copy of the deferred call.
	defer guard(&s.plugin.stats.recoveredPanics, "kvroute.router on_request_headers", &action, s.failOpen)
	return s.handleRequestHeaders(endOfStream)
}

func (s *routerStream) handleRequestHeaders(endOfStream bool) types.Action {
	p := s.plugin
	cfg := p.cfg // one nil check, not one per field read
	// The values alias p.hostVal: valid in this callback only.
	headers := requestHeaders{destination: cfg.DestinationHeader, session: cfg.SessionHeader}
	if p.extraHeaders {
		p.nameExtraHeaders(&headers)
	}
	if err := stripRoutingHeaders(&headers, p.hostVal); err != nil {
		headersError(&headers, err)
	}
	if len(headers.remove) > 0 {
		p.countStripped(headers.remove)
	}
	if cfg.TestHooks {
		s.testHook(headers.testHook)
	}
	if p.adm != nil {
		p.adm.readHeaders(s, &headers)
	}

	path := pathOnly(headers.path)
	if path == cfg.State.Path {
		return s.stateHeaders(headers.method, endOfStream)
	}
	if !p.isInference(path) {
		return s.otherPath(path, &headers, endOfStream)
	}
	if headers.method != "POST" {
		return s.badMethod(path)
	}
	if headers.sessionKey != "" {
		s.keepSessionKey(headers.sessionKey)
	}
	if !cfg.BodyRouting {
		s.decideFromHeaders(headers.prefixKey)
		s.scrub = !endOfStream // the body follows the headers upstream: see scrubBody
		return types.ActionContinue
	}
	if endOfStream {
		return s.emptyBody()
	}
	if n, ok := decimal(headers.contentLength); ok && n > int64(cfg.MaxBodyBytes) {
		return s.bodyTooLarge()
	}
	s.kind = openai.EndpointOf(path)
	s.awaitingBody = true
	// Wait for the body with the headers held: Envoy must run with
	// allow_on_headers_stop_iteration for the body to arrive before the
	// headers continue (and for our header change to reach the upstream).
	return types.ActionPause
}

// nameExtraHeaders names the configured headers pickExtra reads. Out of
// line (noinline): the default configuration has none.
//
//go:noinline
func (p *routerPlugin) nameExtraHeaders(h *requestHeaders) {
	cfg := p.cfg
	h.extra = true
	if !cfg.BodyRouting {
		h.prefixKeyName = cfg.PrefixKeyHeader
	}
	if p.adm != nil {
		h.priorityName, h.deadlineName = cfg.Admission.PriorityHeader, cfg.Admission.DeadlineHeader
	}
}

// keepSessionKey copies the session header's value, which outlives the
// header map's buffer. Out of line (noinline): the copy's allocation is
// code a request without the header would otherwise enter.
//
//go:noinline
func (s *routerStream) keepSessionKey(key string) {
	s.sessionKey = strings.Clone(key)
}

// headersError logs request headers that could not be read or stripped
// and, when the map could not be read, asks the host for the values the
// request path reads. Out of the header callback's line (noinline: the log
// call boxes its argument in place, code every request would enter).
//
//go:noinline
func headersError(h *requestHeaders, err error) {
	proxywasm.LogWarnf("kvroute.router: reading request headers: %v", err)
	if !h.read {
		h.askHost()
	}
}

// pathOnly is :path without its query or fragment.
func pathOnly(path string) string {
	for i := 0; i < len(path); i++ {
		if path[i] == '?' || path[i] == '#' {
			return path[:i]
		}
	}
	return path
}

// decimal reads a header's unsigned decimal number of up to 18 digits
// (content-length, :status). The header paths read it with this loop rather
// than strconv: where each function entered costs a request
// (docs/performance.md), ParseInt is three more functions for three digits.
func decimal(v string) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
		n = n*10 + int64(v[i]-'0')
	}
	return n, true
}

// otherPath passes a request for a path the router does not route, its body
// scrubbed of the gateway-only P/D fields (see scrubBody), or answers 404
// (rejectOtherPaths). Another spelling of the state path (a trailing slash,
// %2F, a doubled slash, upper case) is the state path: it is answered here
// and never forwarded with its token. It and badMethod are kept out of
// OnHttpRequestHeaders so that the code every routed request runs stays small:
// each function entered costs a request (docs/performance.md).
func (s *routerStream) otherPath(path string, h *requestHeaders, endOfStream bool) types.Action {
	p := s.plugin
	if openai.SamePath(path, p.cfg.State.Path) {
		return s.stateHeaders(h.method, endOfStream)
	}
	if h.method == "GET" && p.answersModels() {
		if openai.SamePath(path, openai.ModelsPath) {
			return s.answerModels()
		}
		if id, ok := openai.ModelID(path); ok {
			return s.answerModel(id)
		}
	}
	if p.cfg.RejectOtherPaths {
		p.stats.notFound.Increment(1)
		return s.reject(&openai.Error{Status: 404, Message: "kvroute routes only " + strings.Join(p.cfg.InferencePaths, ", ")})
	}
	p.stats.passThrough.Increment(1)
	s.scrub = !endOfStream
	return types.ActionContinue
}

// badMethod answers 405 to anything but POST on an inference path.
func (s *routerStream) badMethod(path string) types.Action {
	s.plugin.stats.badMethod.Increment(1)
	return s.reject(&openai.Error{Status: 405, Message: "use POST for " + path})
}

// emptyBody and bodyTooLarge reject an inference request for its body. They
// are kept out of the header and body callbacks so that the code every routed
// request enters stays small (each function entered costs a request:
// docs/performance.md).
func (s *routerStream) emptyBody() types.Action {
	s.plugin.stats.badRequest.Increment(1)
	return s.reject(openai.BadRequest("", "the request body is empty: send a JSON object with \"model\" and a prompt"))
}

func (s *routerStream) bodyTooLarge() types.Action {
	p := s.plugin
	p.stats.tooLarge.Increment(1)
	return s.reject(tooLarge(p.cfg.MaxBodyBytes))
}

func tooLarge(limit int) *openai.Error {
	return &openai.Error{Status: 413, Message: "the request body is larger than " + strconv.Itoa(limit) + " bytes (maxBodyBytes)"}
}

func (s *routerStream) OnHttpRequestBody(bodySize int, endOfStream bool) (action types.Action) {
	// One defer and one return: the compiler open-codes the defer. The
	// body's many returns would make it a runtime defer, whose bookkeeping
	// is several more runtime functions entered at every request.
	defer guard(&s.plugin.stats.recoveredPanics, "kvroute.router on_request_body", &action, s.failOpenBody)
	s.bodySize, s.bodyEOS = bodySize, endOfStream // for failOpenBody
	return s.requestBody(bodySize, endOfStream)
}

func (s *routerStream) requestBody(bodySize int, endOfStream bool) types.Action {
	p := s.plugin
	if !s.awaitingBody {
		if s.stateRequest || s.scrub {
			return s.unroutedBody(bodySize, endOfStream)
		}
		return types.ActionContinue
	}
	if bodySize > p.cfg.MaxBodyBytes {
		return s.bodyTooLarge()
	}
	if !endOfStream {
		return types.ActionPause // buffer until the whole body is here
	}
	s.awaitingBody = false
	start := p.mono()
	action := s.routeBody(bodySize)
	p.stats.bodyMicros.Record(micros(p.mono() - start))
	return action
}

// unroutedBody is the body callback of a request the router does not decide
// from its body: a state push, or a body it scrubs (see scrubBody). One
// call site in requestBody for both: each function entered costs a request
// (docs/performance.md).
//
//go:noinline
func (s *routerStream) unroutedBody(bodySize int, endOfStream bool) types.Action {
	if s.stateRequest {
		return s.stateBody(bodySize, endOfStream)
	}
	return s.scrubBody(bodySize, endOfStream)
}

// routeBody parses the whole request body, decides and sets the
// destination header (or holds or rejects the request).
func (s *routerStream) routeBody(bodySize int) types.Action {
	p := s.plugin
	body, err := p.readBody(bodySize)
	if err != nil && bodySize > 0 {
		return s.unreadableBody(err)
	}
	req, perr := p.parser.Parse(body, s.kind)
	if perr != nil {
		return s.unparsable(perr)
	}
	if req.SessionKey == "" {
		req.SessionKey = s.sessionKey
	}
	if req.ClientOnly > 0 && !s.forwardWithoutClientFields(body, req.ClientOnly) {
		return s.reject(errClientFields)
	}
	in := dispatch.Input{
		Model: req.Model, Adapter: req.Adapter, SessionKey: req.SessionKey,
		PromptTokens: req.PromptTokens, MaxTokens: req.MaxTokens,
		Chain: req.Chain, Tokens: req.Tokens, PromptChars: req.PromptChars,
	}
	s.streamed = req.Stream
	s.noUsage = req.Stream && !req.StreamUsage && !req.ContinuousUsage && !p.streamUsageAlways
	s.probeUsage = req.ContinuousUsage && !p.streamUsageAlways
	if p.adm != nil {
		if action, held := p.adm.admit(s, &in); held {
			return action
		}
	}
	s.decide(&in)
	return types.ActionContinue
}

// unreadableBody answers a request whose body cannot be read: unread, it could
// not be checked for the gateway-only P/D fields. Out of line: the log call's
// argument is boxed in place, and each function entered costs a request
// (docs/performance.md).
func (s *routerStream) unreadableBody(err error) types.Action {
	proxywasm.LogWarnf("kvroute.router: reading the request body: %v (request refused)", err)
	s.plugin.stats.failedOpen.Increment(1)
	return s.reject(&openai.Error{Status: 503, Message: "kvroute could not read the request body; retry"})
}

// unparsable rejects a body the parser refused. Out of routeBody's line: a
// routed request never enters it.
func (s *routerStream) unparsable(perr *openai.Error) types.Action {
	s.plugin.stats.parseErrors.Increment(1)
	s.plugin.stats.badRequest.Increment(1)
	return s.reject(perr)
}

// errClientFields answers a request whose client-only P/D fields could not
// be removed.
var errClientFields = &openai.Error{Status: 400, Message: "kv_transfer_params and bootstrap_* are set by the gateway, not by clients"}

// forwardWithoutClientFields replaces the request body with body without
// the n P/D fields only the gateway may set (which Parse found in it) and
// reports whether it could. Out of line, with the body's rewrite: clients
// rarely send those fields.
func (s *routerStream) forwardWithoutClientFields(body []byte, n int) bool {
	p := s.plugin
	if s.panicInBody {
		hookPanic("recover") // test hook: fail open with the fields still in the body
	}
	clean := p.parser.WithoutClientOnly(body)
	if err := proxywasm.ReplaceHttpRequestBody(clean); err != nil {
		proxywasm.LogWarnf("kvroute.router: removing client P/D fields: %v (request rejected)", err)
		p.stats.badRequest.Increment(1)
		return false
	}
	_ = proxywasm.ReplaceHttpRequestHeader("content-length", strconv.Itoa(len(clean)))
	p.stats.clientFieldsRemoved.Increment(uint64(n))
	return true
}

// failOpen runs after a recovered panic in the request headers: the
// client's routing headers must still go (a panic must not turn into an
// SSRF), then the request goes to the least-loaded candidate, and its body,
// which follows, is scrubbed of the gateway-only P/D fields (scrubBody).
func (s *routerStream) failOpen() {
	p := s.plugin
	p.stats.failedOpen.Increment(1)
	s.awaitingBody, s.scrub, s.scrubJSON, s.peeked = false, true, false, 0
	if err := stripRoutingHeaders(&requestHeaders{destination: p.cfg.DestinationHeader}, nil); err != nil {
		return
	}
	if loc := p.leastLoaded(); loc != "" {
		addr, rank := splitRank(loc)
		_ = proxywasm.ReplaceHttpRequestHeader(p.cfg.DestinationHeader, addr)
		if rank != "" {
			setRankHeader(rank)
		}
	}
}

// failOpenBody is failOpen for a panic in the request body: the body
// buffered so far goes on with this callback's Continue, so it is
// scrubbed here, at its end, or, mid-body, refused (unchecked bytes would
// go upstream).
func (s *routerStream) failOpenBody() {
	s.failOpen()
	s.scrub = false
	if !s.bodyEOS {
		s.reject(errFailedMidBody)
		return
	}
	if !s.safeScrub(s.bodySize) {
		s.plugin.stats.badRequest.Increment(1)
		s.reject(openai.ErrClientFieldsUnreadable)
	}
}

// testHook acts on the test hook header (testHooks only): "recover-body"
// panics in the body callback after the parse, when the body holds client
// P/D fields, the others at once (see hookPanic). Out of line: production never enables it.
//
//go:noinline
func (s *routerStream) testHook(value string) {
	s.panicInBody = value == "recover-body"
	hookPanic(value)
}

// reject answers locally with an OpenAI-style error; the request never
// reaches an engine.
func (s *routerStream) reject(e *openai.Error) types.Action {
	s.awaitingBody = false
	headers := [][2]string{{"content-type", "application/json"}}
	if e.Status == 405 {
		headers = append(headers, [2]string{"allow", "POST"})
	}
	if err := proxywasm.SendHttpResponse(uint32(e.Status), headers, e.Body(), -1); err != nil {
		proxywasm.LogWarnf("kvroute.router: sending the %d reply: %v", e.Status, err)
		return types.ActionContinue
	}
	return types.ActionPause
}

// countStripped counts the client's x-data-parallel-rank headers the
// router removed (client_rank_header_removed): a client does not pick a
// rank, and one naming a rank the endpoint lacks would reach an engine
// that rejects it. Out of line (noinline): few requests carry a stripped
// header, and each function entered costs a request (docs/performance.md).
//
//go:noinline
func (p *routerPlugin) countStripped(names []string) {
	for _, n := range names {
		if n == DataParallelRankHeader {
			p.stats.clientRankRemoved.Increment(1)
		}
	}
}
