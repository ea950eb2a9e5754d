package filter

import (
	"strconv"
	"strings"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/tidwall/gjson"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/dispatch"
	"github.com/kvroute/kvroute/filter/statnames"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/openai"
)

// Admission in kvroute.router: when every eligible engine is saturated, a
// parsed inference request stays paused in on_request_body (its headers and
// body held by Envoy) on this worker's admission.Controller queue. The root
// context's tick expires held requests past their deadline (429) and
// releases the others best first: it makes the stream current with
// proxy_set_effective_context, decides, writes the destination header and
// resumes the request. on_done of a held stream (the client went away, or
// Envoy's own timeout answered) frees its place.
//
// Each worker VM has its own queue; the saturation test reads the load
// counters every worker shares (pending prefill tokens, updated by every
// dispatch) and the pushed engine state, so all workers stop and start
// sending at about the same moments.

// The names the documentation gives admission's priority and deadline
// headers (admission.priorityHeader, admission.deadlineHeader): under
// x-kvroute-*, so that a client's own never reaches an engine. The router
// reads them only when the configuration names them.
const (
	PriorityHeader = "x-kvroute-priority"
	DeadlineHeader = "x-kvroute-deadline-ms"
)

// admitter is one worker's admission state.
type admitter struct {
	p    *routerPlugin
	ctl  *admission.Controller
	held map[uint64]*routerStream
	// shed are held streams displaced by a higher-ranked arrival, answered
	// with 429 on the next tick: a local reply for another stream sent from
	// inside a stream callback must not touch the current stream (wasmhost
	// applies its stop to the current callback), and the root's tick has no
	// stream of its own.
	toShed []*routerStream
	loads  []index.Load
	sat    []admission.Load

	heldGauge   [3]proxywasm.MetricGauge
	heldTotal   [3]metricCounter
	released    metricCounter
	expired     metricCounter
	shed        metricCounter
	overflow    metricCounter
	cancelled   metricCounter
	badHeader   metricCounter
	waitMicros  metricHistogram // µs, as every kvroute histogram (held at ms resolution)
	lastHeldLen [3]int
}

// heldRequest is what a held stream keeps to decide later: the router
// input, with its block chain and token counts copied out of the worker's
// shared hasher scratch.
type heldRequest struct {
	in     dispatch.Input
	tokens blockTokens
	class  admission.Class
	heldAt int64
}

// blockTokens answers TokensIn from a table taken when the request was
// parsed.
type blockTokens []int

func (b blockTokens) TokensIn(n int) int {
	if n <= 0 || len(b) == 0 {
		return 0
	}
	return b[min(n, len(b))-1]
}

// admissionHeaders are the configured priority and deadline headers' values
// (admission.priorityHeader, admission.deadlineHeader: set by the operator's
// Envoy configuration, not by the client), read in on_request_headers before
// every x-kvroute-* header is stripped, and the arrival time deadlines count
// from.
type admissionHeaders struct {
	priority, deadline string
	arrivedMs          int64
}

// readHeaders, admit and streamDone run only with admission on: their callers
// test p.adm for nil, so that with admission off (the default) a request
// enters none of them (each function entered costs a request, however early it
// returns: docs/performance.md).
func (a *admitter) readHeaders(s *routerStream, h *requestHeaders) {
	// Copies: the values alias the header map's buffer.
	s.admHdr.priority, s.admHdr.deadline = strings.Clone(h.priority), strings.Clone(h.deadline)
	s.admHdr.arrivedMs = a.p.now().UnixMilli()
}

// newAdmitter returns nil when admission is off.
func newAdmitter(p *routerPlugin) *admitter {
	cfg := p.cfg.Admission
	if !cfg.Enabled {
		return nil
	}
	a := &admitter{p: p, ctl: admission.NewController(cfg), held: map[uint64]*routerStream{}}
	for i, band := range admission.Bands {
		a.heldGauge[i] = proxywasm.DefineGaugeMetric(statnames.Tagged(statnames.Admission, statnames.TagBand, band, "held"))
		a.heldTotal[i] = defineCounter(statnames.Tagged(statnames.Admission, statnames.TagBand, band, "held_total"))
	}
	a.released = defineCounter(statnames.Admission + "released")
	a.expired = defineCounter(statnames.Admission + "expired")
	a.shed = defineCounter(statnames.Admission + "shed")
	a.overflow = defineCounter(statnames.Admission + "overflow")
	a.cancelled = defineCounter(statnames.Admission + "cancelled")
	a.badHeader = defineCounter(statnames.Admission + "bad_header")
	a.waitMicros = defineHistogram(statnames.Admission + "wait_us")
	if err := proxywasm.SetTickPeriodMilliSeconds(uint32(cfg.TickMs)); err != nil {
		proxywasm.LogCriticalf("kvroute.router: setting the admission tick: %v (held requests would wait for their deadline)", err)
	}
	return a
}

// admit runs after the body is parsed. held reports that the stream must
// stay paused (held, or answered with an error); action is then what
// on_request_body returns.
func (a *admitter) admit(s *routerStream, in *dispatch.Input) (action types.Action, held bool) {
	p := a.p
	cfg := a.ctl.Config()
	prio, dl := s.admHdr.priority, s.admHdr.deadline
	path, _ := proxywasm.GetHttpRequestHeader(":path")
	if i := indexAnyPathEnd(path); i >= 0 {
		path = path[:i]
	}
	class, err := cfg.Classify(prio, path, in.Model)
	if err != nil {
		a.badHeader.Increment(1)
		return s.reject(openai.BadRequest(cfg.PriorityHeader, "%s: %v", cfg.PriorityHeader, err)), true
	}
	nowMs := p.now().UnixMilli()
	deadline, err := cfg.Deadline(class, dl, min(s.admHdr.arrivedMs, nowMs))
	if err != nil {
		a.badHeader.Increment(1)
		return s.reject(openai.BadRequest(cfg.DeadlineHeader, "%s: %v", cfg.DeadlineHeader, err)), true
	}
	p.refreshState()
	v, shed, evicted := a.ctl.Arrive(uint64(s.id), class, deadline, nowMs, a.saturated(in.Model))
	if evicted {
		a.shed.Increment(1)
		if victim := a.held[shed.ID]; victim != nil {
			delete(a.held, shed.ID)
			victim.held = nil
			a.toShed = append(a.toShed, victim)
		}
	}
	switch v {
	case admission.Admit:
		a.syncGauges()
		return types.ActionContinue, false
	case admission.Refuse:
		a.overflow.Increment(1)
		a.syncGauges()
		return s.tooBusy("every engine is saturated and the gateway's queue is full"), true
	}
	h := &heldRequest{in: *in, class: class, heldAt: nowMs}
	h.in.Chain = append([]uint64(nil), in.Chain...)
	if in.Tokens != nil {
		h.tokens = make(blockTokens, len(in.Chain))
		for i := range h.tokens {
			h.tokens[i] = in.Tokens.TokensIn(i + 1)
		}
		h.in.Tokens = h.tokens
	}
	s.held = h
	a.held[uint64(s.id)] = s
	a.heldTotal[class.Band()].Increment(1)
	a.syncGauges()
	return types.ActionPause, true
}

// saturated is the test over the engines that could serve model: healthy,
// breaker closed, serving that model (or any).
//
// Pushed state older than state.staleAfterMs is ignored (only the load
// counters count then): a metrics service that stopped pushing must not
// leave a full queue frozen in place and every request held until it
// expires.
func (a *admitter) saturated(model string) bool {
	p := a.p
	stale := p.stateGen != 0 && p.now().UnixMilli()-p.stateTs > int64(p.cfg.State.StaleAfterMs)
	a.loads = p.disp.Loads(a.loads[:0])
	a.sat = a.sat[:0]
	for i := range p.hosts {
		h := &p.hosts[i]
		if h.Unhealthy || h.BreakerOpen || (h.Model != "" && model != "" && h.Model != model && !hasAdapter(h.Adapters, model)) {
			continue
		}
		var l admission.Load
		if !stale {
			l.Waiting, l.KVUsage = h.Waiting, h.KVUsage
		}
		if h.Slot >= 0 && h.Slot < len(a.loads) {
			l.PendingPrefillTokens = int64(a.loads[h.Slot].PrefillTokens)
		}
		a.sat = append(a.sat, l)
	}
	return a.ctl.Config().Thresholds.AllSaturated(a.sat)
}

func hasAdapter(adapters []string, model string) bool {
	for _, x := range adapters {
		if x == model {
			return true
		}
	}
	return false
}

// tick runs on the root context: expire, then release while an engine has
// room for the next request in line.
func (a *admitter) tick() {
	if a == nil {
		return
	}
	for i, s := range a.toShed {
		a.answer429(s, "the gateway shed this request for higher-priority work while every engine was saturated")
		a.toShed[i] = nil
	}
	a.toShed = a.toShed[:0]
	if a.ctl.Queue().Len() == 0 {
		return
	}
	p := a.p
	now := p.now()
	nowMs := now.UnixMilli()
	p.refreshState()
	next := func() bool {
		it, ok := a.ctl.Queue().Peek()
		if !ok {
			return true
		}
		model := ""
		if s := a.held[it.ID]; s != nil && s.held != nil {
			model = s.held.in.Model
		}
		return a.saturated(model)
	}
	expired := a.ctl.Tick(nowMs, next, func(it admission.Item) {
		s := a.held[it.ID]
		delete(a.held, it.ID)
		if s == nil {
			return
		}
		a.released.Increment(1)
		a.waitMicros.Record(uint64(max(nowMs-it.HeldAtMs, 0)) * 1000)
		a.release(s)
	})
	for _, it := range expired {
		s := a.held[it.ID]
		delete(a.held, it.ID)
		a.expired.Increment(1)
		if s != nil {
			a.waitMicros.Record(uint64(max(nowMs-it.HeldAtMs, 0)) * 1000)
			a.answer429(s, "the request's deadline passed while every engine was saturated")
		}
	}
	a.syncGauges()
}

// release decides for a held stream and resumes it, in its own context.
func (a *admitter) release(s *routerStream) {
	h := s.held
	s.held = nil
	if h == nil || s.decided {
		return // failed open after a panic: already sent
	}
	if err := proxywasm.SetEffectiveContext(s.id); err != nil {
		// The stream is gone (its on_done will not come again): nothing to resume.
		proxywasm.LogWarnf("kvroute.router: releasing a held request: %v", err)
		return
	}
	func() {
		defer guard(&a.p.stats.recoveredPanics, "kvroute.router admission release", nil, s.failOpen)
		s.decide(&h.in)
	}()
	if err := proxywasm.ResumeHttpRequest(); err != nil {
		proxywasm.LogWarnf("kvroute.router: resuming a held request: %v", err)
	}
}

// answer429 answers a held stream that will not be sent.
func (a *admitter) answer429(s *routerStream, why string) {
	s.held = nil
	if err := proxywasm.SetEffectiveContext(s.id); err != nil {
		return
	}
	s.tooBusy(why)
}

// streamDone frees the place of a stream that ends while held.
func (a *admitter) streamDone(s *routerStream) {
	for i, x := range a.toShed {
		if x == s { // gone before its 429 went out
			a.toShed = append(a.toShed[:i], a.toShed[i+1:]...)
			break
		}
	}
	if s.held == nil {
		return
	}
	s.held = nil
	delete(a.held, uint64(s.id))
	if a.ctl.Cancel(uint64(s.id)) {
		a.cancelled.Increment(1)
	}
	a.syncGauges()
}

// syncGauges moves the held-by-band gauges (summed over workers) by this
// worker's change.
func (a *admitter) syncGauges() {
	n := a.ctl.Queue().ByBand()
	for i := range n {
		if d := n[i] - a.lastHeldLen[i]; d != 0 {
			a.heldGauge[i].Add(int64(d))
		}
	}
	a.lastHeldLen = n
}

// tooBusy answers 429 with Retry-After and an OpenAI-style error body.
func (s *routerStream) tooBusy(message string) types.Action {
	retry := s.plugin.cfg.Admission.RetryAfterS
	b := []byte(`{"error":{"message":`)
	b = gjson.AppendJSONString(b, message+"; retry after "+strconv.Itoa(retry)+" s")
	b = append(b, `,"type":"rate_limit_exceeded","param":null,"code":429}}`...)
	headers := [][2]string{{"content-type", "application/json"}, {"retry-after", strconv.Itoa(retry)}}
	if err := proxywasm.SendHttpResponse(429, headers, b, -1); err != nil {
		proxywasm.LogWarnf("kvroute.router: sending the 429 reply: %v", err)
		return types.ActionContinue
	}
	return types.ActionPause
}

func indexAnyPathEnd(path string) int {
	for i := 0; i < len(path); i++ {
		if path[i] == '?' || path[i] == '#' {
			return i
		}
	}
	return -1
}
