package filter

import (
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"

	"github.com/kvroute/kvroute/dispatch"
	"github.com/kvroute/kvroute/scorer"
	"github.com/kvroute/kvroute/snapshot"
)

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
	// precise: the metrics service bridges the engine's KV events into
	// removals the index can trust instead of its capacity model
	// (snapshot.Host.PreciseCacheState).
	precise bool
}

// preciseCapacityFactor is how far past the engine's KV capacity the
// index keeps a host's blocks under precise cache state: the removals age
// them out, and the capacity model only bounds what no removal will ever
// name (blocks whose store the service matched to no route), which a
// trusted host has up to a fifth of.
const preciseCapacityFactor = 2

// indexCapacity is the KV capacity the index ages the host's blocks by:
// under precise cache state, whose removals do it, a backstop at
// preciseCapacityFactor times the engine's (unbounded when unknown); else
// the engine's, -1 when unknown (leave the index's as it is).
func (c *candidate) indexCapacity() int {
	switch {
	case c.precise:
		return preciseCapacityFactor * max(c.capacityTokens, 0)
	case c.capacityTokens > 0:
		return c.capacityTokens
	}
	return -1
}

// housekeepMs is how often on_tick revisits the slot table: frees departed
// slots whose requests ended, and takes back slots another worker's view
// reassigned.
const housekeepMs = 1000

// setHosts makes cs the candidates and gives them their index slots
// through the dispatcher (dispatch.Dispatcher.SetHosts: one Sync of the
// slot table, applying only what changed; for pushed state (pushed), the
// slots of hosts that left it are freed).
func (p *routerPlugin) setHosts(cs []candidate, pushed bool) {
	hosts := make([]scorer.Host, 0, len(cs))
	facts := make([]dispatch.HostFacts, 0, len(cs))
	pos := make(map[string]int, len(cs))
	anyPrecise := false
	for _, c := range cs {
		h := scorer.Host{Address: c.address, Slot: -1}
		if old, ok := p.pos[c.address]; ok && old < len(p.hosts) {
			o := &p.hosts[old]
			h.Slot, h.Gen, h.LatencyEWMAMs = o.Slot, o.Gen, o.LatencyEWMAMs
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
		facts = append(facts, dispatch.HostFacts{CapacityTokens: c.indexCapacity(), ClearedAtMs: c.clearedAtMs})
		if c.precise {
			anyPrecise = true
		}
		pos[c.address] = len(hosts)
		hosts = append(hosts, h)
	}
	p.hosts, p.pos = hosts, pos
	p.precise = nil
	if anyPrecise {
		p.precise = cs
	}
	p.lastModel = ""
	p.slotsApplied(p.disp.SetHosts(hosts, facts, pushed, p.now().UnixMilli()))
}

// slotsApplied counts and logs what an application of the candidates to
// the slot table did.
func (p *routerPlugin) slotsApplied(rep dispatch.SlotReport) {
	if rep.Freed > 0 {
		p.stats.slotsFreed.Increment(uint64(rep.Freed))
	}
	if rep.Err != nil {
		proxywasm.LogWarnf("kvroute.router: updating the index's host slots: %v (hosts keep their slots; retried on the next tick)", rep.Err)
	}
	if rep.Unassigned > 0 {
		p.stats.slotsUnassigned.Increment(uint64(rep.Unassigned))
		proxywasm.LogWarnf("kvroute.router: %d of %d hosts got no index slot (the index tracks %d hosts per gateway): they are routed without prefix matches or shared load counts", rep.Unassigned, len(p.hosts), dispatch.MaxSlots)
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
	p.slotsApplied(p.disp.Housekeep(p.hosts, nowMs))
}

// refreshState picks up a state push made on any worker.
func (p *routerPlugin) refreshState() {
	if gen := loadStateGen(p.store); gen != 0 && gen != p.stateGen {
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
func (p *routerPlugin) applyPushed(gen uint64, st snapshot.State) {
	hc := p.disp.HashConfig()
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
			capacityTokens: capacity, clearedAtMs: h.ClearedAtMs, precise: h.PreciseCacheState}
	}
	// Engine facts the index keeps for every worker, KV capacity (drives
	// eviction of the index's beliefs) and cache clears (AllBlocksCleared,
	// restarts), ride the same Sync; each worker applies a change once.
	p.setHosts(cs, true)
	p.stateGen, p.stateTs, p.stateCursor = gen, st.TimestampMs, st.Cursor
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
		if p.precise != nil {
			p.dropPrecise()
		}
	}
	if p.breakers.AnyOpen() {
		p.markOpenBreakers(stale, nowMs)
		return
	}
	// Every breaker closed (nearly always): no per-host lookups.
	for i := range p.hosts {
		h := &p.hosts[i]
		h.Stale, h.BreakerOpen = stale, false
	}
}

// dropPrecise puts the capacity model back for the hosts whose pushed
// state said precise cache state, once that state is stale: without fresh
// pushes their removals no longer come, and only the capacity model ages
// out what the engines evict. The next fresh push that says precise turns
// it off again. Out of prepare's line (noinline): rare.
//
//go:noinline
func (p *routerPlugin) dropPrecise() {
	cs := p.precise
	if len(cs) != len(p.hosts) {
		p.precise = nil
		return
	}
	facts := make([]dispatch.HostFacts, len(cs))
	for i := range cs {
		facts[i] = dispatch.HostFacts{CapacityTokens: cs[i].indexCapacity(), ClearedAtMs: cs[i].clearedAtMs}
		if cs[i].precise && cs[i].capacityTokens > 0 {
			facts[i].CapacityTokens = cs[i].capacityTokens
		}
	}
	rep := p.disp.SetHosts(p.hosts, facts, true, p.now().UnixMilli())
	p.slotsApplied(rep)
	if rep.Err != nil {
		return // the next stale decision tries again
	}
	p.precise = nil
	p.stats.preciseDropped.Increment(1)
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
		h.BreakerOpen = p.breakers.Open(h.Address, nowMs)
	}
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
