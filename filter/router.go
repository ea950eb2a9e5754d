package filter

import (
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/dispatch"
	"github.com/kvroute/kvroute/filter/hostbuf"
	"github.com/kvroute/kvroute/filter/quietbody"
	"github.com/kvroute/kvroute/filter/statnames"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/scorer"
)

// clock, when set (by tests), replaces the real clock for both wall-clock
// readings (p.now) and durations (p.mono), so tests can step through
// breaker cool-downs, response latencies and state staleness.
var clock func() time.Time

// routerStarted, when set (by tests), receives every router plugin that
// starts, so tests can read its books.
var routerStarted func(*routerPlugin)

// routerPlugin is the kvroute.router root, one per worker VM. It owns the
// VM's view of the candidates, the index client and the decision scratch.
type routerPlugin struct {
	cfg    *config.Config
	stats  routerStats
	token  string // state endpoint bearer token ("" disables pushes)
	ix     *index.Index
	rt     *dispatch.Router
	parser openai.Parser

	// hosts is the candidate set handed to every decision; pos maps an
	// address to its position. Rebuilt when pushed state changes.
	hosts    []scorer.Host
	pos      map[string]int
	stateGen uint64 // generation of the pushed state in hosts (0: static endpoints)
	stateTs  int64  // its timestampMs
	breakers *breakers
	// Per address, what this VM last applied to the index from pushed state.
	capacity  map[string]int
	clearedAt map[string]int64
	// The slot table as this VM last applied its candidates to it
	// (setHosts, syncSlots): pushed says they came from pushed state;
	// syncHosts and refs are Sync's input and output, in hosts' order;
	// slotSeq is the table's seq after; syncDue asks the tick for another
	// Sync (departed slots still kept, or a failed write); departedAt times
	// the kept departed slots' grace (slotFate), with fateNow and kept as
	// one Sync's scratch; housekeptAt is the last housekeep.
	pushed      bool
	syncHosts   []index.SyncHost
	refs        []index.HostRef
	slotSeq     uint32
	syncDue     bool
	departedAt  map[index.HostRef]int64
	fateNow     int64
	kept        []departure
	housekeptAt int64
	// slotGens is, per slot, the generation of the host this worker last
	// gave it to (0: none), so that a slot reassigned drops what the
	// router learned about its previous host (Router.ForgetSlot).
	slotGens [index.MaxSlots]uint32

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
	reportsSent, reportsFailed, removalsApplied   metricCounter
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
// method_not_allowed, 413 too_large).
func rejectedCounter(reason string) metricCounter {
	return defineCounter(statnames.Tagged(statnames.Router+"requests.", statnames.TagReason, reason, "rejected"))
}

func newRouter(cfg *config.Config) (*routerPlugin, error) {
	now := clock
	if now == nil {
		now = time.Now
	}
	p := &routerPlugin{cfg: cfg, now: now, stepped: clock != nil, pos: map[string]int{}, capacity: map[string]int{}, clearedAt: map[string]int64{},
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
		reportsSent:          counterMetric("reports.sent"),
		reportsFailed:        counterMetric("reports.failed"),
		removalsApplied:      counterMetric("state.removals_applied"),
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
	store := &sharedStore{emulated: emulatedHost}
	ix, err := index.New(store, index.Config{})
	if err != nil {
		return nil, err
	}
	p.ix = ix
	// Session pins and prefix memory in shared data too: every worker of
	// the gateway routes a conversation's next turn alike (docs/topology.md).
	p.rt = dispatch.New(dispatch.Config{Handler: cfg.Handler, Index: ix, Shared: store})
	p.parser = openai.NewParser(cfg, index.NewHasher(ix.Config().Hash))
	p.breakers = newBreakers(cfg.CircuitBreaker)
	p.timeResponses = cfg.CircuitBreaker.LatencyThresholdMs > 0 || cfg.Handler.ReadsLatency()
	_, p.timeFirstToken = cfg.Handler.ReadsTTFT()
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
	p.departedAt = map[index.HostRef]int64{}
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
	for _, w := range cfg.Warnings {
		proxywasm.LogWarnf("kvroute.router: %s", w)
	}
	if routerStarted != nil {
		routerStarted(p)
	}
	return p, nil
}

// candidate is one host as configuration or pushed state describes it.
type candidate struct {
	address, role, model string
	adapters             []string
	maxAdapters          int // adapter slots (0: unknown)
	adapterSlotsUsed     int
	healthy              bool
	waiting, running     int
	kvUsage              float64
	blockCapacity        int
	capacityTokens       int   // KV capacity in tokens (0: unknown)
	clearedAtMs          int64 // when the engine last dropped its cache
}

// slotGraceMs is how long a host that left the pushed candidate set keeps
// its index slot while the gateway still counts requests in flight on it
// (long streams; or counts a dead worker never gave back). A slot with
// nothing in flight is freed at once, and any departed slot is reused at
// once when a new host needs one and the table is full.
const slotGraceMs = 10 * 60 * 1000

// housekeepMs is how often on_tick revisits the slot table: frees departed
// slots whose requests ended, and takes back slots another worker's view
// reassigned.
const housekeepMs = 1000

// setHosts makes cs the candidates, applying to the index only what
// changed: one Sync of the slot table (one read, at most one write)
// registers new addresses, applies capacities and clears, and, for pushed
// state (pushed), frees the slots of hosts that left it. A push whose
// addresses, capacities and clears are those already applied, the usual
// push (only queue numbers move), touches no shared data beyond the slot
// table's 8-byte stamp.
func (p *routerPlugin) setHosts(cs []candidate, pushed bool) {
	hosts := make([]scorer.Host, 0, len(cs))
	pos := make(map[string]int, len(cs))
	changed := len(cs) != len(p.hosts) || pushed != p.pushed
	p.syncHosts = p.syncHosts[:0]
	for _, c := range cs {
		h := scorer.Host{Address: c.address, Slot: -1}
		if old, ok := p.pos[c.address]; ok && old < len(p.hosts) {
			o := &p.hosts[old]
			h.Slot, h.Gen, h.LatencyEWMAMs = o.Slot, o.Gen, o.LatencyEWMAMs
		} else {
			changed = true
		}
		role, err := scorer.ParseRole(c.role)
		if err != nil {
			role = scorer.RoleBoth
		}
		h.Role, h.Model, h.Adapters = role, c.model, c.adapters
		h.MaxAdapters, h.AdapterSlotsUsed = c.maxAdapters, c.adapterSlotsUsed
		h.Unhealthy = !c.healthy
		h.Waiting, h.Running, h.KVUsage = c.waiting, c.running, c.kvUsage
		h.BlockCapacity = c.blockCapacity
		sh := index.SyncHost{Addr: c.address, CapacityTokens: -1}
		if c.capacityTokens > 0 && p.capacity[c.address] != c.capacityTokens {
			sh.CapacityTokens = c.capacityTokens
			changed = true
		}
		if c.clearedAtMs > p.clearedAt[c.address] {
			sh.Clear = true
			changed = true
		}
		p.syncHosts = append(p.syncHosts, sh)
		pos[c.address] = len(hosts)
		hosts = append(hosts, h)
	}
	if changed {
		for addr := range p.pos { // forget what was applied for departed hosts
			if _, ok := pos[addr]; !ok {
				delete(p.capacity, addr)
				delete(p.clearedAt, addr)
			}
		}
	}
	p.hosts, p.pos, p.pushed = hosts, pos, pushed
	p.lastModel = ""
	if changed || p.syncDue || p.ix.SlotSeq() != p.slotSeq {
		if p.syncSlots() {
			for i, c := range cs {
				if p.syncHosts[i].CapacityTokens >= 0 {
					p.capacity[c.address] = c.capacityTokens
				}
				if p.syncHosts[i].Clear {
					p.clearedAt[c.address] = c.clearedAtMs
				}
			}
		}
	}
}

// syncSlots applies p.syncHosts (the candidates, in p.hosts' order) to the
// slot table and gives p.hosts their slots. It reports whether the table
// holds them; on failure the hosts keep the slots they had (new ones get
// none) and the next tick tries again.
func (p *routerPlugin) syncSlots() bool {
	var fate func(index.Departed) index.Fate
	if p.pushed {
		// Only pushed state speaks for the gateway's candidates: a router
		// on static endpoints frees nothing (another plugin sharing the
		// vm_id may route to the slots it does not know).
		p.fateNow = p.now().UnixMilli()
		p.kept = p.kept[:0]
		fate = p.slotFate
	}
	refs, res, err := p.ix.Sync(p.syncHosts, p.refs, fate)
	p.refs = refs
	p.syncDue = res.Kept > 0 && p.pushed
	if p.pushed {
		p.forgetDepartures()
	}
	if res.Freed > 0 {
		p.stats.slotsFreed.Increment(uint64(res.Freed))
	}
	if err != nil {
		p.syncDue = true
		proxywasm.LogWarnf("kvroute.router: updating the index's host slots: %v (hosts keep their slots; retried on the next tick)", err)
	}
	for i := range p.hosts {
		h := &p.hosts[i]
		if r := refs[i]; err == nil || r.Slot >= 0 {
			h.Slot, h.Gen = r.Slot, r.Gen
		}
		if h.Slot >= 0 && h.Slot < len(p.slotGens) && p.slotGens[h.Slot] != h.Gen {
			// Another host than this worker last saw holds the slot: what
			// the router learned about the previous one must not carry over.
			if p.slotGens[h.Slot] != 0 {
				p.rt.ForgetSlot(h.Slot)
			}
			p.slotGens[h.Slot] = h.Gen
		}
	}
	if res.Unassigned > 0 {
		p.stats.slotsUnassigned.Increment(uint64(res.Unassigned))
		proxywasm.LogWarnf("kvroute.router: %d of %d hosts got no index slot (the index tracks %d hosts per gateway): they are routed without prefix matches or shared load counts", res.Unassigned, len(p.hosts), index.MaxSlots)
	}
	p.slotSeq = p.ix.SlotSeq()
	return err == nil
}

// slotFate is what syncSlots does with the slot of a host that left the
// pushed candidate set: free it once nothing is in flight on it, or after
// slotGraceMs; meanwhile offer it to a new host that finds the table full.
// The grace is timed from when this worker first saw the slot departed.
func (p *routerPlugin) slotFate(d index.Departed) index.Fate {
	if d.InFlight == 0 {
		return index.FreeSlot
	}
	since, ok := p.departedAt[d.Ref]
	if !ok {
		since = p.fateNow
	}
	if p.fateNow-since >= slotGraceMs {
		return index.FreeSlot
	}
	p.kept = append(p.kept, departure{d.Ref, since})
	return index.ReuseSlot
}

// departure is a departed slot kept, and since when.
type departure struct {
	ref   index.HostRef
	since int64
}

// forgetDepartures keeps in p.departedAt only the slots the last Sync kept.
func (p *routerPlugin) forgetDepartures() {
	clear(p.departedAt)
	for _, d := range p.kept {
		p.departedAt[d.ref] = d.since
	}
}

// housekeep runs on the tick, at most every housekeepMs: it applies a push
// another worker stored (off the request path), frees departed slots whose
// requests have ended, and, when another worker rewrote the slot table,
// checks this worker's slots against it.
func (p *routerPlugin) housekeep() {
	nowMs := p.now().UnixMilli()
	if nowMs-p.housekeptAt < housekeepMs && nowMs >= p.housekeptAt {
		return
	}
	p.housekeptAt = nowMs
	p.refreshState()
	if p.syncDue || p.ix.SlotSeq() != p.slotSeq {
		for i := range p.syncHosts {
			p.syncHosts[i].CapacityTokens, p.syncHosts[i].Clear = -1, false
		}
		p.syncSlots()
	}
}

// refreshState picks up a state push made on any worker.
func (p *routerPlugin) refreshState() {
	if gen := loadStateGen(); gen != 0 && gen != p.stateGen {
		p.applyState(gen)
	}
}

// applyState reads the state generation gen from shared data and makes its
// hosts the candidates. It is refreshState's rare path, in a function of its
// own so that the check every request makes stays a few instructions.
func (p *routerPlugin) applyState(gen uint64) {
	st, err := loadState()
	if err != nil {
		proxywasm.LogWarnf("kvroute.router: reading pushed state: %v (keeping the previous candidates)", err)
		p.stateGen = gen
		return
	}
	p.applyPushed(gen, st)
}

// applyPushed makes st, the pushed state of generation gen, the
// candidates: applyState's work once the state is read, which the worker
// that received the push does with the state it just validated.
func (p *routerPlugin) applyPushed(gen uint64, st pushedState) {
	hc := p.ix.Config().Hash
	tokensPerBlock := max(hc.BlockChars/max(hc.CharsPerToken, 1), 1)
	cs := make([]candidate, len(st.Hosts))
	for i, h := range st.Hosts {
		capacity := h.BlockSize * h.NumGPUBlocks // tokens
		addr := h.Address
		if h.DataParallelSize > 1 {
			addr = rankLocation(addr, h.Rank)
		}
		cs[i] = candidate{address: addr, role: h.Role, model: h.Model, adapters: h.Adapters,
			maxAdapters: h.MaxAdapters, adapterSlotsUsed: h.AdapterSlotsUsed, healthy: h.Healthy,
			waiting: h.Waiting, running: h.Running, kvUsage: h.KVUsage, blockCapacity: capacity / tokensPerBlock,
			capacityTokens: capacity, clearedAtMs: h.ClearedAtMs}
	}
	// Engine facts the index keeps for every worker, KV capacity (drives
	// eviction of the index's beliefs) and cache clears (AllBlocksCleared,
	// restarts), ride the same Sync; each worker applies a change once.
	p.setHosts(cs, true)
	p.stateGen, p.stateTs = gen, st.TimestampMs
	if len(st.Gateways) > 0 {
		p.remoteLoads(st.Gateways) // gateways that do not report still count the others'
	}
}

// prepare refreshes per-decision host fields: pushed-state staleness and the
// circuit breakers.
func (p *routerPlugin) prepare(nowMs int64) {
	p.refreshState()
	stale := p.stateGen != 0 && nowMs-p.stateTs > int64(p.cfg.State.StaleAfterMs)
	if stale {
		p.stats.staleState.Increment(1)
		p.dropRemote()
	}
	if p.breakers.anyOpen() {
		p.markOpenBreakers(stale, nowMs)
		return
	}
	// Every breaker closed (nearly always): no per-host lookups.
	for i := range p.hosts {
		h := &p.hosts[i]
		h.Stale, h.BreakerOpen = stale, false
	}
}

// markOpenBreakers is prepare's per-host breaker lookup while some breaker is
// open, out of line (noinline: inlined, its map lookups would be back in
// prepare): each function entered costs a request (docs/performance.md), and
// breakers are nearly always all closed.
//
//go:noinline
func (p *routerPlugin) markOpenBreakers(stale bool, nowMs int64) {
	for i := range p.hosts {
		h := &p.hosts[i]
		h.Stale = stale
		h.BreakerOpen = p.breakers.open(h.Address, nowMs)
	}
}

// syncStats turns the index's and the router's cumulative counters into metric
// increments. One loop over arrays rather than eight inlined copies of the
// test and the call: each function entered costs a request
// (docs/performance.md).
func (p *routerPlugin) syncStats() {
	rs := p.rt.Stats()
	now := [len(p.lastSynced)]uint64{p.ix.CASRetries(), rs.FeedbackRequests, rs.OverPredicted, rs.UnderPredicted,
		rs.ConfirmedCachedTokens, rs.IndexErrors, rs.LoadErrors, rs.Disaggregated, rs.PredictedCachedTokens, rs.PredictionErrorTokens}
	for i, c := range [len(p.lastSynced)]*metricCounter{&p.stats.casRetries, &p.stats.feedback, &p.stats.overPredicted,
		&p.stats.underPredicted, &p.stats.confirmedCached, &p.stats.indexErrors, &p.stats.loadErrors, &p.stats.disaggregated,
		&p.stats.feedbackPredicted, &p.stats.predictionError} {
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

// mono is the time since the plugin started, from the monotonic clock
// alone: one host call per reading in Wasm (monoNanos), where time.Now
// makes two (wall and monotonic).
func (p *routerPlugin) mono() time.Duration {
	if p.stepped {
		return p.steppedMono()
	}
	return time.Duration(monoNanos() - p.bornMono)
}

// steppedMono is mono under a test clock. Out of line (noinline): inlined,
// the clock's call and Time.Sub would be code every reading enters in Wasm.
//
//go:noinline
func (p *routerPlugin) steppedMono() time.Duration { return p.now().Sub(p.born) }

// wallMs is the wall clock in Unix milliseconds (the index's, the pushed
// state's and the breakers' timestamps): one host call in Wasm
// (wallMillis), where time.Now makes two.
func (p *routerPlugin) wallMs() int64 {
	if p.stepped {
		return p.steppedWallMs()
	}
	return wallMillis()
}

// steppedWallMs is wallMs under a test clock, out of line for the reason
// of steppedMono.
//
//go:noinline
func (p *routerPlugin) steppedWallMs() int64 { return p.now().UnixMilli() }

// millis is d in milliseconds, truncated to whole microseconds: exactly
// float64(d/time.Microsecond)/1000 for any |d| below 2^53 ns (104 days),
// computed in floating point because Wasm has no multiply-high: Go divides
// an int64 by a constant with a multiply-high sequence spelled out in
// 32-bit halves, where the float division and truncation are one
// instruction each.
func millis(d time.Duration) float64 { return math.Trunc(float64(d)/1e3) / 1e3 }

// micros is d in whole microseconds, for the latency histograms.
func micros(d time.Duration) uint64 { return uint64(max(d, 0) / time.Microsecond) }

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

// leastLoaded is the fail-open choice: the candidate with the fewest
// requests in flight as of the last decision ("" without candidates).
func (p *routerPlugin) leastLoaded() string {
	best := -1
	for i := range p.hosts {
		h := &p.hosts[i]
		if h.Unhealthy || h.BreakerOpen {
			continue
		}
		if best < 0 || h.InFlight < p.hosts[best].InFlight {
			best = i
		}
	}
	if best < 0 {
		return ""
	}
	return p.hosts[best].Address
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
	tail         tailBuf // end of the previous response chunk, for fields split across chunks
}

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
	if samePath(path, p.cfg.State.Path) {
		return s.stateHeaders(h.method, endOfStream)
	}
	if h.method == "GET" && samePath(path, modelsPath) && p.answersModels() {
		return s.answerModels()
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

// readBody reads the request body into p.bodyBuf (lent to the ABI bridge,
// see filter/hostbuf) instead of a fresh allocation per request: in Wasm the
// allocation, not the copy, is most of the read. The result is valid until the next readBody: the
// parser copies what outlives the callback (model, user), the hasher
// consumes the prompt, and the forwarded body is rewritten into its own
// buffer.
func (p *routerPlugin) readBody(n int) ([]byte, error) {
	return p.readBuffer(n, bufferRequestBody, proxywasm.GetHttpRequestBody)
}

// readBuffer reads n bytes of a body buffer (bufferRequestBody or
// bufferResponseBody) into p.bodyBuf, through kvroute's own host call in
// the official Go Wasm build (readBodyInto) and with get, the SDK's
// reader, otherwise. A response chunk is only scanned for cached_tokens,
// so it shares the buffer.
func (p *routerPlugin) readBuffer(n int, buffer uint32, get func(start, maxSize int) ([]byte, error)) ([]byte, error) {
	if cap(p.bodyBuf) >= n || p.growBodyBuf(n) {
		if b, ok := readBodyInto(p.bodyBuf, buffer, n); ok {
			return b, nil
		}
	}
	return p.sdkReadBuffer(n, get)
}

// sdkReadBuffer is readBuffer through the SDK: outside the official Go
// Wasm build, and in it for a response chunk larger than any request body
// the router takes (read the ordinary way rather than keep a buffer that
// size) or an answer the host did not write into p.bodyBuf. Out of line
// (noinline): in Wasm a routed request never gets here.
//
//go:noinline
func (p *routerPlugin) sdkReadBuffer(n int, get func(start, maxSize int) ([]byte, error)) ([]byte, error) {
	if cap(p.bodyBuf) < n {
		return get(0, n)
	}
	// Lend and withdraw around the one host call, without a defer (as every
	// other lender does): the defer's wrapper would be one more function
	// entered in Wasm.
	hostbuf.Lend(p.bodyBuf)
	b, err := get(0, n)
	hostbuf.Lend(nil)
	return b, err
}

// growBodyBuf makes p.bodyBuf hold n bytes, unless n is more than maxBodyBytes
// (the buffer never grows past it). Out of readBuffer's line (noinline): it
// grows only until the largest body has been seen, and each function entered
// costs a request (docs/performance.md).
//
//go:noinline
func (p *routerPlugin) growBodyBuf(n int) bool {
	if n > p.cfg.MaxBodyBytes {
		return false
	}
	p.bodyBuf = make([]byte, n)
	return true
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
	if p.parser.Dropped() > 0 && !s.forwardWithoutClientFields(body) {
		return s.reject(errClientFields)
	}
	in := dispatch.Input{
		Model: req.Model, Adapter: req.Adapter, SessionKey: req.SessionKey,
		PromptTokens: req.PromptTokens, MaxTokens: req.MaxTokens,
		Chain: p.parser.Hasher().Blocks(), Tokens: p.parser.Hasher(), PromptChars: p.parser.Hasher().Len(),
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

// servesModel reports whether some candidate serves model (a host that
// declares no model serves any; an adapter a host lists counts as a model
// it serves). With no candidates at all (no push yet) nothing is known,
// and Envoy's fallback policy picks as before. It stops at the first host
// that serves the model.
func (p *routerPlugin) servesModel(model string) bool {
	if model == "" || len(p.hosts) == 0 {
		return true
	}
	for i := range p.hosts {
		h := &p.hosts[i]
		if h.Model == "" || h.Model == model || len(h.Adapters) > 0 && hasAdapter(h.Adapters, model) {
			return true
		}
	}
	return false
}

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
		p.stats.noCandidate.Increment(1)
		return
	}
	if adapter != "" {
		model = adapter
	}
	p.stats.notFound.Increment(1)
	p.stats.modelNotFound.Increment(1)
	s.reject(&openai.Error{Status: 404, Param: "model", Code: "model_not_found",
		Message: "The model '" + model + "' does not exist."})
}

// errClientFields answers a request whose client-only P/D fields could not
// be removed.
var errClientFields = &openai.Error{Status: 400, Message: "kv_transfer_params and bootstrap_* are set by the gateway, not by clients"}

// forwardWithoutClientFields replaces the request body with body without
// the P/D fields only the gateway may set (which parse found in it) and
// reports whether it could. Out of line, with the body's rewrite: clients
// rarely send those fields.
func (s *routerStream) forwardWithoutClientFields(body []byte) bool {
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
	p.stats.clientFieldsRemoved.Increment(uint64(p.parser.Dropped()))
	return true
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
	// instead of reading the clock three or four times (each a host call
	// in Wasm, two through time.Now).
	p.ix.PinClock(nowMs)
	p.prepare(nowMs)
	t, res := p.rt.Decide(in, p.hosts)
	p.ix.UnpinClock()
	if p.reporter != nil && t.Host >= 0 {
		p.reporter.addRoute(t.Address, in.Chain, in.PromptTokens)
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
	if emulatedHost {
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
	p.breakers.dispatched(s.primary, nowMs)
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
		_ = proxywasm.ReplaceHttpRequestHeader(PrefillHostHeader, addr)
	}
	if s.plugin.cfg.ORCA {
		_ = proxywasm.ReplaceHttpRequestHeader(orcaFormatHeader, "TEXT")
	}
}

// rankLocation is the candidate address of an endpoint's data-parallel
// rank: "host:port|rank". Each rank is a cache location of its own (its own
// index slot, prefix bits, load and breaker); '|' never occurs in host:port,
// so the destination header gets the endpoint back with splitRank.
func rankLocation(addr string, rank int) string {
	return addr + "|" + strconv.Itoa(rank)
}

// splitRank splits a candidate address into the endpoint's host:port and
// its data-parallel rank ("" for an endpoint without ranks).
// A rank has at most two digits (config.MaxDataParallelSize), so only the
// last three bytes are looked at: inlined, no call on the request path.
func splitRank(location string) (addr, rank string) {
	for i := len(location) - 1; i >= 0 && i >= len(location)-3; i-- {
		if location[i] == '|' {
			return location[:i], location[i+1:]
		}
	}
	return location, ""
}

// setRankHeader names the chosen data-parallel rank to the engine. Out of
// route's line (noinline): most endpoints have no ranks, and each function
// entered costs a request (docs/performance.md).
//
//go:noinline
func setRankHeader(rank string) {
	_ = proxywasm.ReplaceHttpRequestHeader(DataParallelRankHeader, rank)
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
	b := p.rt.AppendExplain(nil, res, p.hosts)
	b = append(b, " predicted_cached_tokens="...)
	s.explanation = string(strconv.AppendInt(b, int64(predicted), 10))
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
	if !ok || p.breakers.failing > 0 {
		s.breakerResult(served, ok, status, latencyMs)
	}
	if p.timeResponses || p.cfg.ORCA {
		p.learnHost(served, s.ticket.Host, latencyMs)
	}
	if s.explanation != "" {
		_ = proxywasm.ReplaceHttpResponseHeader(p.cfg.DebugHeader, s.explanation)
	}
	if endOfStream {
		p.rt.FirstToken(&s.ticket)
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
	if p.breakers.result(primary, false, p.now().UnixMilli()) {
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
	if !p.breakers.result(served, ok, p.now().UnixMilli()) {
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
	v, err := proxywasm.GetHttpResponseHeader(orcaHeader)
	hostbuf.Lend(nil)
	if err != nil {
		return
	}
	if l := parseORCA(v); l.ok {
		h.KVUsage, h.Waiting, h.Running = l.KVUsage, l.Waiting, l.Running
	}
}

// responseStatusAndPeer reads the response's :status (0 when unreadable)
// and the address that served it (primary when the host does not say).
// Both values land in p.hostVal and are dropped here: the address returned
// is primary or the candidate's own string, so nothing is allocated unless
// a host outside the candidate set answered.
func (p *routerPlugin) responseStatusAndPeer(primary string) (status int, served string) {
	if v, ok := readResponseHeader(p.hostVal, ":status"); ok && len(v) == 3 {
		if n, ok := decimal(unsafeString(v)); ok && n >= 100 {
			status = int(n)
		}
	}
	v, err := readUpstreamAddress(p.hostVal)
	if addr, _ := splitRank(primary); err != nil || len(v) == 0 || string(v) == addr {
		return status, primary
	}
	return status, p.otherPeer(v)
}

// otherPeer is the address of a peer other than the primary (a fallback
// took the request): the candidate's own string, or a copy of v for a host
// outside the candidate set. Out of line (noinline), as only a fallback
// needs it.
//
//go:noinline
func (p *routerPlugin) otherPeer(v []byte) string {
	if i, known := p.pos[string(v)]; known {
		return p.hosts[i].Address
	}
	return string(v)
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

// sdkUpstreamAddress reads upstream.address through the SDK: outside the
// official Go Wasm build, and when the in-place read cannot serve.
// Out of line (noinline): in Wasm only a response without the property
// gets here.
//
//go:noinline
func sdkUpstreamAddress() ([]byte, error) {
	return proxywasm.GetProperty(upstreamAddressPath)
}

// upstreamAddressPath is the property Envoy sets to the upstream host that
// took the request.
var upstreamAddressPath = []string{"upstream", "address"}

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
			p.rt.FirstToken(&s.ticket)
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
			if n, ok := cachedTokens(s.tail.bytes(), chunk); ok {
				s.cached, s.feedbackSet = n, true
				// The same usage object's prompt_tokens, when the chunk
				// holds it and the router samples this request: the
				// model's characters per token.
				if s.ticket.SampleUsage() {
					s.ticket.EnginePromptTokens, _ = lastNumber(chunk, promptTokensKey)
				}
			}
			if !endOfStream {
				s.tail.keep(chunk)
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
	p.rt.Finish(&s.ticket, cached)
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
		p.breakers.abandoned(s.primary)
	}
}

// cachedTokensKey is the field vLLM and SGLang report prefix-cache hits in
// (usage.prompt_tokens_details.cached_tokens), in non-streaming bodies and in
// the final chunk of a stream with include_usage.
var cachedTokensKey = []byte(`"cached_tokens":`)

const tailKeep = 64

// cachedTokens finds the last complete cached_tokens value in tail+chunk:
// a run of up to 18 digits after the key (and optional spaces) that
// something other than a digit follows (a run that reaches the end may
// continue in the next chunk). It scans bytes instead of parsing JSON: a
// stream's chunks are SSE events, and the field may straddle two chunks. A
// value found in chunk is the last one (a value across the seam starts
// before it), so the seam is looked at only when chunk has none.
func cachedTokens(tail, chunk []byte) (val int, found bool) {
	val, found = lastNumber(chunk, cachedTokensKey)
	if !found && len(tail) > 0 {
		return seamCachedTokens(tail, chunk)
	}
	return val, found
}

// promptTokensKey is usage.prompt_tokens (the quote after the name keeps
// prompt_tokens_details out).
var promptTokensKey = []byte(`"prompt_tokens":`)

// lastNumber finds the last complete value of key in b: a run of up to 18
// digits after the key (and optional spaces) that something other than a
// digit follows.
func lastNumber(b, key []byte) (val int, found bool) {
	for {
		i := indexBytes(b, key)
		if i < 0 {
			return val, found
		}
		b = b[i+len(key):]
		j := 0
		for j < len(b) && b[j] == ' ' {
			j++
		}
		k, n := j, 0
		for k < len(b) && b[k] >= '0' && b[k] <= '9' && k-j < 18 {
			n = n*10 + int(b[k]-'0')
			k++
		}
		if k > j && k < len(b) && (b[k] < '0' || b[k] > '9') {
			found, val = true, n
		}
	}
}

// seamCachedTokens finds a cached_tokens value across the seam of two chunks:
// in tail joined with the head of chunk. Out of line (noinline): only a stream
// whose usage is split across chunks needs it, and each function entered costs
// a response (docs/performance.md).
//
//go:noinline
func seamCachedTokens(tail, chunk []byte) (int, bool) {
	var buf [2 * tailKeep]byte
	joined := append(buf[:0], tail...)
	joined = append(joined, chunk[:min(len(chunk), tailKeep)]...)
	return cachedTokens(nil, joined)
}

// tailBuf holds the last tailKeep bytes of a response chunk in the stream
// itself (no allocation per stream).
type tailBuf struct {
	b [tailKeep]byte
	n int
}

func (t *tailBuf) bytes() []byte { return t.b[:t.n] }

// keep replaces the tail with the end of chunk. Out of line (noinline): only a
// response in several chunks keeps a tail, and each function entered costs a
// response (docs/performance.md).
//
//go:noinline
func (t *tailBuf) keep(chunk []byte) {
	if len(chunk) > tailKeep {
		chunk = chunk[len(chunk)-tailKeep:]
	}
	t.n = copy(t.b[:], chunk)
}

// indexBytes is bytes.Index for the short keys the response scan looks for.
// Go's Wasm build has no assembly search, and its portable one (Rabin-Karp
// for longer keys) is two more functions brought into the cache per
// response; this loop over the key's first byte is all a response needs.
func indexBytes(b, sub []byte) int {
	if len(sub) == 0 {
		return 0
	}
	first := sub[0]
	for i := 0; i+len(sub) <= len(b); i++ {
		if b[i] != first {
			continue
		}
		j := 1
		for j < len(sub) && b[i+j] == sub[j] {
			j++
		}
		if j == len(sub) {
			return i
		}
	}
	return -1
}
