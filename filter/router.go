package filter

import (
	"os"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/dispatch"
	"github.com/kvroute/kvroute/filter/statnames"
	"github.com/kvroute/kvroute/health"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/scorer"
)

// routerPlugin is the kvroute.router root, one per worker VM. It owns the
// VM's view of the candidates, its dispatcher (the door to the index and
// the decision) and the request scratch.
type routerPlugin struct {
	cfg    *config.Config
	stats  routerStats
	token  string // state endpoint bearer token ("" disables pushes)
	disp   *dispatch.Dispatcher
	store  *sharedStore // the gateway's shared data
	parser openai.Parser

	// hosts is the candidate set handed to every decision; pos maps an
	// address to its position. Rebuilt when pushed state changes.
	hosts    []scorer.Host
	pos      map[string]int
	stateGen uint64 // generation of the pushed state in hosts (0: static endpoints)
	stateTs  int64  // its timestampMs
	// stateCursor is the pulled state's cursor in the service's log of
	// routes and removals (filter/pull.go); "" when pushed.
	stateCursor string
	breakers    *health.Breakers
	// precise is the pushed candidates (cs of setHosts) while some host's
	// capacity model is off for precise cache state, nil otherwise: the
	// capacities dropPrecise puts back when the pushed state goes stale.
	precise []candidate
	// housekeptAt is the last housekeep (the candidates' index slots are
	// the dispatcher's: dispatch.Dispatcher.SetHosts).
	housekeptAt int64

	lastSynced [10]uint64 // the counts syncStats last turned into metrics
	keyChain   [1]uint64  // a header-only request's chain: its prefix key's hash
	// extraHeaders: the configuration names a header pickExtra reads.
	extraHeaders bool
	// The state pull (filter/pull.go): one in flight, when the last began.
	pulling  bool
	pulledAt int64
	dest     []byte
	now      func() time.Time
	adm      *admitter // nil when admission is off (filter/admission.go)
	// reporter is this worker's routing report in the making (nil when
	// state.report is off: filter/report.go).
	reporter *reporter

	// born is when the plugin started (see mono), and bornMono the
	// monotonic clock then (monoNanos); stepped says a test clock drives
	// now, mono and wallMs.
	born     time.Time
	bornMono int64
	stepped  bool
	// timeResponses says something reads a response's time to first byte:
	// the breaker's latency threshold, or the latency scorer (through the
	// hosts' LatencyEWMAMs). Otherwise, as with every preset, the response
	// path reads no clock.
	timeResponses bool
	// timeFirstToken says the profile learns each host's time to first
	// token (predicted_ttft): the first chunk of a streamed response then
	// reads the clock for the ticket's TTFTMs.
	timeFirstToken bool
	// streamUsageAlways: the engines put usage in every stream, asked or
	// not (config streamUsage "always").
	streamUsageAlways bool
	// lastProfile and its counter spare profileCounter a map lookup.
	lastProfile        string
	lastProfileCounter metricCounter
	// lastModel and its counter spare modelCounter a lookup; setHosts
	// clears lastModel, as the models the candidates name may change.
	lastModel        string
	lastModelCounter metricCounter

	// bodyBuf receives every request body and response chunk (see
	// readBuffer); it grows to the largest seen, at most maxBodyBytes.
	bodyBuf []byte
	// hostVal receives the host values a callback reads and drops at once
	// (the request header map, :status, the upstream address), lent like
	// bodyBuf so that they cost no allocation. A value larger than it is
	// allocated as usual.
	hostVal []byte
	// streams is what is left of the slab newStream hands streams out of.
	streams []routerStream
}

// hostValSize holds a typical request header map (a few hundred bytes to
// a few KB) with room to spare.
const hostValSize = 8 << 10

type routerStats struct {
	commonStats
	routed, noCandidate, failedOpen, passThrough  metricCounter
	badRequest, tooLarge, badMethod, notFound     metricCounter
	parseErrors, staleState, fallbacksUsed        metricCounter
	predictedCached, confirmedCached              metricCounter
	promptTokens, feedbackPromptTokens            metricCounter
	feedbackPredicted, predictionError            metricCounter
	feedback, overPredicted, underPredicted       metricCounter
	indexErrors, loadErrors                       metricCounter
	statePushes, stateUnauthorized, stateRejected metricCounter
	stateOlder, statePulls, statePullFailed       metricCounter
	breakerOpened, disaggregated                  metricCounter
	clientFieldsRemoved, modelNotFound            metricCounter
	unavailable, modelUnavailable                 metricCounter
	clientRankRemoved                             metricCounter
	reportsSent, reportsFailed, removalsApplied   metricCounter
	preciseDropped                                metricCounter
	slotsFreed, slotsUnassigned                   metricCounter
	decisionMicros, bodyMicros                    metricHistogram
	byProfile                                     map[string]metricCounter
	byModel                                       map[string]metricCounter
}

func counterMetric(name string) metricCounter {
	return defineCounter(statnames.Router + name)
}

// rejectedCounter counts the requests the router answered itself with an
// error, by reason (400 bad_request, 404 not_found, 405
// method_not_allowed, 413 too_large, 503 unavailable).
func rejectedCounter(reason string) metricCounter {
	return defineCounter(statnames.Tagged(statnames.Router+"requests.", statnames.TagReason, reason, "rejected"))
}

func newRouter(cfg *config.Config, handler *scorer.Handler, warnings []string, opts Options) (*routerPlugin, error) {
	now := opts.clock()
	p := &routerPlugin{cfg: cfg, now: now, stepped: opts.Clock != nil, pos: map[string]int{},
		hostVal: make([]byte, hostValSize), born: now(), bornMono: monoNanos()}
	p.stats = routerStats{
		commonStats:          newCommonStats(statnames.Router),
		routed:               counterMetric("requests.routed"),
		noCandidate:          counterMetric("requests.no_candidate"),
		failedOpen:           counterMetric("requests.failed_open"),
		passThrough:          counterMetric("requests.pass_through"),
		badRequest:           rejectedCounter("bad_request"),
		tooLarge:             rejectedCounter("too_large"),
		badMethod:            rejectedCounter("method_not_allowed"),
		notFound:             rejectedCounter("not_found"),
		parseErrors:          counterMetric("parse_errors"),
		staleState:           counterMetric("stale_state"),
		fallbacksUsed:        counterMetric("fallbacks_used"),
		predictedCached:      counterMetric("predicted_cached_tokens"),
		confirmedCached:      counterMetric("confirmed_cached_tokens"),
		promptTokens:         counterMetric("prompt_tokens"),
		feedbackPromptTokens: counterMetric("feedback.prompt_tokens"),
		feedbackPredicted:    counterMetric("feedback.predicted_cached_tokens"),
		predictionError:      counterMetric("feedback.prediction_error_tokens"),
		feedback:             counterMetric("feedback.responses"),
		overPredicted:        counterMetric("feedback.over_predicted"),
		underPredicted:       counterMetric("feedback.under_predicted"),
		indexErrors:          counterMetric("index_errors"),
		loadErrors:           counterMetric("load_errors"),
		statePushes:          counterMetric("state.pushes"),
		stateUnauthorized:    counterMetric("state.unauthorized"),
		stateRejected:        counterMetric("state.rejected"),
		stateOlder:           counterMetric("state.rejected_older"),
		statePulls:           counterMetric("state.pulls"),
		statePullFailed:      counterMetric("state.pull_failed"),
		breakerOpened:        counterMetric("breaker.opened"),
		disaggregated:        counterMetric("requests.disaggregated"),
		clientFieldsRemoved:  counterMetric("client_pd_fields_removed"),
		modelNotFound:        counterMetric("requests.model_not_found"),
		unavailable:          rejectedCounter("unavailable"),
		modelUnavailable:     counterMetric("requests.model_unavailable"),
		clientRankRemoved:    counterMetric("client_rank_header_removed"),
		reportsSent:          counterMetric("reports.sent"),
		reportsFailed:        counterMetric("reports.failed"),
		removalsApplied:      counterMetric("state.removals_applied"),
		preciseDropped:       counterMetric("state.precise_dropped"),
		slotsFreed:           counterMetric("host_slots.freed"),
		slotsUnassigned:      counterMetric("host_slots.unassigned"),
		decisionMicros:       defineHistogram(statnames.Router + "decision_us"),
		bodyMicros:           defineHistogram(statnames.Router + "request_body_us"),
		byProfile:            map[string]metricCounter{},
		byModel:              map[string]metricCounter{},
	}
	p.token = cfg.State.Token
	if cfg.State.TokenEnv != "" {
		p.token = os.Getenv(cfg.State.TokenEnv)
		if p.token == "" {
			proxywasm.LogWarnf("kvroute.router: state.tokenEnv %s is empty in the VM: every state push will get 401 (pass it with vm_config.environment_variables)", cfg.State.TokenEnv)
		}
	}
	store := &sharedStore{emulated: opts.Emulated}
	p.store = store
	// The index, session pins and prefix memory in shared data: every
	// worker of the gateway routes a conversation's next turn alike
	// (docs/topology.md).
	var indexNow func() int64 // the index's clock: the wall clock, or the test's
	if p.stepped {
		indexNow = func() int64 { return p.now().UnixMilli() }
	}
	disp, err := dispatch.NewShared(dispatch.Config{Handler: handler, Shared: store}, indexNow)
	if err != nil {
		return nil, err
	}
	p.disp = disp
	p.parser = openai.NewParser(cfg, disp.NewHasher())
	p.breakers = health.NewBreakers(cfg.CircuitBreaker)
	p.timeResponses = cfg.CircuitBreaker.LatencyThresholdMs > 0 || handler.ReadsLatency()
	_, p.timeFirstToken = handler.ReadsTTFT()
	p.streamUsageAlways = cfg.StreamUsage == config.StreamUsageAlways
	static := make([]candidate, 0, len(cfg.Endpoints))
	for _, e := range cfg.Endpoints {
		for r := range max(e.DataParallelSize, 1) {
			addr := e.Address
			if e.DataParallelSize > 1 {
				addr = rankLocation(addr, r)
			}
			static = append(static, candidate{address: addr, role: e.Role, model: e.Model, healthy: true})
		}
	}
	p.setHosts(static, false)
	// The tick frees the slots of departed hosts and applies pushes off the
	// request path (housekeep); admission, when on, sets a faster one.
	if err := proxywasm.SetTickPeriodMilliSeconds(housekeepMs); err != nil {
		proxywasm.LogWarnf("kvroute.router: setting the tick: %v (departed hosts' index slots are freed on pushes only)", err)
	}
	p.adm = newAdmitter(p)
	p.extraHeaders = !cfg.BodyRouting && cfg.PrefixKeyHeader != "" ||
		p.adm != nil && (cfg.Admission.PriorityHeader != "" || cfg.Admission.DeadlineHeader != "") ||
		(&requestHeaders{destination: cfg.DestinationHeader}).stripped(cfg.SessionHeader)
	if cfg.State.Report.Cluster != "" {
		p.startReports()
	}
	for _, w := range warnings {
		proxywasm.LogWarnf("kvroute.router: %s", w)
	}
	if opts.started != nil {
		opts.started(p)
	}
	return p, nil
}

// syncStats turns the index's and the router's cumulative counters into metric
// increments. One loop over arrays rather than eight inlined copies of the
// test and the call: each function entered costs a request
// (docs/performance.md). feedback.responses goes last: a reader (a scrape,
// a test) that sees a response counted sees its tokens counted too, never
// a ratio over a response whose numbers are still on their way.
func (p *routerPlugin) syncStats() {
	rs := p.disp.Stats()
	now := [len(p.lastSynced)]uint64{rs.CASRetries, rs.OverPredicted, rs.UnderPredicted,
		rs.ConfirmedCachedTokens, rs.IndexErrors, rs.LoadErrors, rs.Disaggregated, rs.PredictedCachedTokens, rs.PredictionErrorTokens,
		rs.FeedbackRequests}
	for i, c := range [len(p.lastSynced)]*metricCounter{&p.stats.casRetries, &p.stats.overPredicted,
		&p.stats.underPredicted, &p.stats.confirmedCached, &p.stats.indexErrors, &p.stats.loadErrors, &p.stats.disaggregated,
		&p.stats.feedbackPredicted, &p.stats.predictionError, &p.stats.feedback} {
		if now[i] > p.lastSynced[i] {
			c.Increment(now[i] - p.lastSynced[i])
		}
	}
	p.lastSynced = now
}

func (p *routerPlugin) profileCounter(name string) metricCounter {
	if name == p.lastProfile && name != "" {
		return p.lastProfileCounter // one profile serves most requests: no map lookup
	}
	return p.switchProfile(name)
}

// switchProfile looks up (or defines) the counter of a profile other than the
// last one. Out of line: one profile serves most requests, and each function
// entered costs a request (docs/performance.md).
func (p *routerPlugin) switchProfile(name string) metricCounter {
	c, ok := p.byProfile(name)
	if !ok {
		c = defineCounter(statnames.Tagged(statnames.Router+"profile.", statnames.TagProfile, name, "requests"))
		p.stats.byProfile[name] = c
	}
	p.lastProfile, p.lastProfileCounter = name, c
	return c
}

// modelCounter is the routed-requests counter of model (tag kvroute_model).
func (p *routerPlugin) modelCounter(model string) metricCounter {
	if model == p.lastModel && model != "" {
		return p.lastModelCounter // one model serves most requests: no lookup
	}
	return p.switchModel(model)
}

// maxModelTags bounds the kvroute_model values one worker defines: past
// it, models count as "other". Envoy cannot forget a defined stat, and
// models come and go with deployments.
const maxModelTags = 64

// switchModel looks up (or defines) the counter of a model other than the
// last one: the model's own if some candidate names it, else "other", so
// the series are bounded by what the state lists, not by what clients
// send. Out of line (noinline): one model serves most requests, and each
// function entered costs a request (docs/performance.md).
//
//go:noinline
func (p *routerPlugin) switchModel(model string) metricCounter {
	tag := statnames.OtherModel
	for i := range p.hosts {
		if model != "" && p.hosts[i].Model == model {
			tag = model
			break
		}
	}
	c, ok := p.stats.byModel[tag]
	if !ok {
		if len(p.stats.byModel) >= maxModelTags {
			tag = statnames.OtherModel
			c, ok = p.stats.byModel[tag]
		}
		if !ok {
			c = defineCounter(statnames.Tagged(statnames.Router+"model.", statnames.TagModel, tag, "requests"))
			p.stats.byModel[tag] = c
		}
	}
	p.lastModel, p.lastModelCounter = model, c
	return c
}

func (p *routerPlugin) byProfile(name string) (metricCounter, bool) {
	c, ok := p.stats.byProfile[name]
	return c, ok
}

// streamSlab is how many streams newStream allocates at once.
const streamSlab = 16

// newStream hands out the next stream of a slab allocated streamSlab at a
// time: one allocation per 16 streams instead of one each, so that the context
// creation of a typical request enters none of the allocator's code (each
// function entered costs a request: docs/performance.md). A stream is never
// handed out twice, so nothing that still holds one (admission's queues, a
// late callback) can see it reused; a slab's memory (about 7 KB) goes when
// none of its streams is referenced any more, so a long stream keeps at most
// 15 finished ones' worth alive.
func (p *routerPlugin) newStream(id uint32) types.HttpContext {
	if len(p.streams) == 0 {
		p.newSlab()
	}
	s := &p.streams[0]
	p.streams = p.streams[1:]
	s.plugin, s.id = p, id
	return s
}

// newSlab allocates the next slab of streams, out of newStream's line
// (noinline): one stream in streamSlab needs it.
//
//go:noinline
func (p *routerPlugin) newSlab() {
	p.streams = make([]routerStream, streamSlab)
}

func (p *routerPlugin) onTick() {
	defer guard(&p.stats.recoveredPanics, "kvroute.router on_tick", nil, nil)
	p.adm.tick()
	p.housekeep()
	if p.cfg.State.Pull.Cluster != "" {
		p.pullState(p.now().UnixMilli())
	}
	if p.reporter != nil {
		p.report(p.wallMs())
	}
}

func (p *routerPlugin) isInference(path string) bool {
	for _, ip := range p.cfg.InferencePaths {
		if path == ip {
			return true
		}
	}
	return false
}

// routerStream is one request through kvroute.router.
type routerStream struct {
	types.DefaultHttpContext
	plugin *routerPlugin
	id     uint32       // context id, for releasing a held request
	held   *heldRequest // set while admission holds it
	admHdr admissionHeaders

	kind         openai.Endpoint
	awaitingBody bool // inference request paused for its body
	stateRequest bool // a push to the state endpoint
	sessionKey   string
	// scrub: the body goes on without a decision from it and must lose
	// the gateway-only P/D fields (scrubBody); scrubJSON: it is a JSON
	// object, held to its end; peeked: how much of it was whitespace.
	scrub, scrubJSON bool
	peeked           int
	// The body callback's arguments, for failOpenBody.
	bodySize    int
	bodyEOS     bool
	panicInBody bool // test hook "recover-body"

	decided     bool
	ticket      dispatch.Ticket
	primary     string
	decidedAt   time.Duration // p.mono() at the decision
	explanation string
	firstByte   bool
	streamed    bool // the client asked for a streamed response ("stream": true)
	// noUsage: the response cannot carry the engine's usage (a stream
	// that did not ask for it), so its chunks are not read. probeUsage:
	// the stream asked only for continuous_usage_stats, which engines may
	// ignore; its first chunk says whether the rest carry usage.
	noUsage     bool
	probeUsage  bool
	feedbackSet bool
	finished    bool // feedback given and load released (finish)
	cached      int
	// promptTokens is the router's estimate of the prompt's length, for
	// the hit-ratio counters (prompt_tokens, feedback.prompt_tokens).
	promptTokens int
	tail         openai.Tail // end of the previous response chunk, for fields split across chunks
}
