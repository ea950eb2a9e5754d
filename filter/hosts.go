package filter

import (
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scorer"
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

// indexCapacity is the KV capacity the index ages the host's blocks by:
// none (0, unbounded) under precise cache state, whose removals do it;
// else the engine's, -1 when unknown (leave the index's as it is).
func (c *candidate) indexCapacity() int {
	switch {
	case c.precise:
		return 0
	case c.capacityTokens > 0:
		return c.capacityTokens
	}
	return -1
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
	anyPrecise := false
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
		if want := c.indexCapacity(); want >= 0 {
			if applied, ok := p.capacity[c.address]; !ok || applied != want {
				sh.CapacityTokens = want
				changed = true
			}
		}
		if c.precise {
			anyPrecise = true
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
	p.precise = nil
	if anyPrecise {
		p.precise = cs
	}
	p.lastModel = ""
	if changed || p.syncDue || p.ix.SlotSeq() != p.slotSeq {
		if p.syncSlots() {
			for i, c := range cs {
				if p.syncHosts[i].CapacityTokens >= 0 {
					p.capacity[c.address] = p.syncHosts[i].CapacityTokens
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
				p.disp.ForgetSlot(h.Slot)
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

// dropPrecise puts the capacity model back for the hosts whose pushed
// state said precise cache state, once that state is stale: without fresh
// pushes their removals no longer come, and only the capacity model ages
// out what the engines evict. The next fresh push that says precise turns
// it off again. Out of prepare's line (noinline): rare.
//
//go:noinline
func (p *routerPlugin) dropPrecise() {
	cs := p.precise
	if len(cs) != len(p.syncHosts) {
		p.precise = nil
		return
	}
	for i := range cs {
		sh := &p.syncHosts[i]
		sh.CapacityTokens, sh.Clear = -1, false
		if cs[i].precise && cs[i].capacityTokens > 0 {
			sh.CapacityTokens = cs[i].capacityTokens
		}
	}
	if !p.syncSlots() {
		return // the next stale decision tries again
	}
	for i := range cs {
		if cs[i].precise && cs[i].capacityTokens > 0 {
			p.capacity[cs[i].address] = cs[i].capacityTokens
		}
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
		h.BreakerOpen = p.breakers.open(h.Address, nowMs)
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
