package dispatch

import (
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scorer"
)

// One worker's candidates in the index's slot table.
//
// The index tracks MaxSlots hosts per gateway, in a table every worker
// shares; each worker applies its candidates to it (SetHosts: one Sync, one
// read and at most one write) and revisits it on a timer (Housekeep): pods
// come and go for ever, so the slots of hosts that left pushed state are
// freed once nothing is in flight on them, or after SlotGraceMs. What a
// worker applied (capacities, clears) is remembered here so that the usual
// push, where only queue numbers move, writes nothing but the table's
// stamp. The state is per worker (one Dispatcher per VM); the table is the
// gateway's, so two workers applying one push write one consistent table
// (index.Sync decides from the table it read).

// MaxSlots is how many hosts the index tracks per gateway: a host beyond
// them is routed without prefix matches or shared load counts.
const MaxSlots = index.MaxSlots

// SlotGraceMs is how long a host that left the pushed candidate set keeps
// its index slot while the gateway still counts requests in flight on it
// (long streams; or counts a dead worker never gave back). A slot with
// nothing in flight is freed at once, and any departed slot is reused at
// once when a new host needs one and the table is full.
const SlotGraceMs = 10 * 60 * 1000

// HostFacts are the engine facts the index keeps for every worker, which
// ride a SetHosts: each worker applies a change once.
type HostFacts struct {
	// CapacityTokens is the KV capacity in tokens the index ages the
	// host's blocks by (the eviction of its beliefs): 0 for none
	// (unbounded, as under precise cache state, whose removals do it),
	// negative when unknown (leave the index's as it is).
	CapacityTokens int
	// ClearedAtMs is when the engine last dropped its cache
	// (AllBlocksCleared, a restart): a later value than the one applied
	// clears the host's blocks.
	ClearedAtMs int64
}

// SlotReport says what one application of the candidates to the slot
// table did, for the caller's counters and log.
type SlotReport struct {
	// Freed counts slots freed (departed hosts, or reused for a new host);
	// Unassigned counts hosts left without a slot (Slot -1).
	Freed, Unassigned int
	// Err is a failed read or write of the table: the hosts keep the slots
	// they had (new ones get none) and the next Housekeep tries again.
	Err error
}

// slotTable is what this worker last applied to the slot table.
type slotTable struct {
	// pushed: the candidates came from pushed state, which alone speaks
	// for the gateway's candidates and frees departed slots.
	pushed bool
	// applied is, per address of the candidate set last applied (n
	// hosts), the facts applied to the index.
	n       int
	applied map[string]applied
	// sync and refs are Sync's input and output, in the hosts' order; seq
	// is the table's seq after; due asks Housekeep for another Sync
	// (departed slots still kept, or a failed write).
	sync []index.SyncHost
	refs []index.HostRef
	seq  uint32
	due  bool
	// departedAt times the kept departed slots' grace (slotFate), with
	// fateNow and kept as one Sync's scratch.
	departedAt map[index.HostRef]int64
	fateNow    int64
	kept       []departure
	// gens is, per slot, the generation of the host this worker last gave
	// it to (0: none), so that a slot reassigned drops what the dispatcher
	// learned about its previous host (forgetSlot).
	gens [MaxSlots]uint32
}

// applied is what this worker applied of a host's facts.
type applied struct {
	capacity    int
	hasCapacity bool // capacity was applied (0 is a capacity: unbounded)
	clearedAtMs int64
}

// departure is a departed slot kept, and since when.
type departure struct {
	ref   index.HostRef
	since int64
}

// SetHosts makes hosts the candidates and gives them their index slots,
// applying to the index only what changed: one Sync of the slot table
// registers new addresses, applies the facts (facts[i] is hosts[i]'s; nil:
// none known) and, for pushed state (pushed), frees the slots of hosts that
// left it. hosts carry the Slot and Gen they had (-1 for a new address),
// which SetHosts updates in place; a push whose addresses and facts are
// those already applied, the usual push, touches no shared data beyond the
// slot table's 8-byte stamp. nowMs times the departed slots' grace.
//
// Without an index, hosts get slots in order, as from Register.
func (r *Dispatcher) SetHosts(hosts []scorer.Host, facts []HostFacts, pushed bool, nowMs int64) SlotReport {
	// Deferred (unlike the request path's unlocks): a panic in the index
	// must not leave the lock held for the worker's next decision.
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ix == nil {
		for i := range hosts {
			r.registerLocal(hosts[i].Address, &hosts[i])
		}
		return SlotReport{}
	}
	s := &r.slots
	changed := len(hosts) != s.n || pushed != s.pushed
	s.sync = s.sync[:0]
	for i := range hosts {
		addr := hosts[i].Address
		was, ok := s.applied[addr]
		changed = changed || !ok
		f := HostFacts{CapacityTokens: -1}
		if i < len(facts) {
			f = facts[i]
		}
		sh := index.SyncHost{Addr: addr, CapacityTokens: -1}
		if f.CapacityTokens >= 0 && (!was.hasCapacity || was.capacity != f.CapacityTokens) {
			sh.CapacityTokens = f.CapacityTokens
			changed = true
		}
		if f.ClearedAtMs > was.clearedAtMs {
			sh.Clear = true
			changed = true
		}
		s.sync = append(s.sync, sh)
	}
	if changed { // forget what was applied for departed hosts
		next := make(map[string]applied, len(hosts))
		for i := range hosts {
			next[hosts[i].Address] = s.applied[hosts[i].Address]
		}
		s.applied = next
	}
	s.n, s.pushed = len(hosts), pushed
	if !changed && !s.due && r.ix.SlotSeq() == s.seq {
		return SlotReport{}
	}
	rep := r.syncSlots(hosts, nowMs)
	if rep.Err == nil {
		for i, sh := range s.sync {
			a := s.applied[sh.Addr]
			if sh.CapacityTokens >= 0 {
				a.capacity, a.hasCapacity = sh.CapacityTokens, true
			}
			if sh.Clear {
				a.clearedAtMs = facts[i].ClearedAtMs
			}
			s.applied[sh.Addr] = a
		}
	}
	return rep
}

// Housekeep revisits the slot table, hosts being the candidates of the
// last SetHosts: when a departed slot is still kept, a write failed, or
// another worker rewrote the table, it syncs again (freeing departed slots
// whose requests ended, and taking back slots another worker's view
// reassigned). Otherwise it reads only the table's stamp.
func (r *Dispatcher) Housekeep(hosts []scorer.Host, nowMs int64) SlotReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &r.slots
	if r.ix == nil || len(s.sync) != len(hosts) || !s.due && r.ix.SlotSeq() == s.seq {
		return SlotReport{}
	}
	for i := range s.sync {
		s.sync[i].CapacityTokens, s.sync[i].Clear = -1, false
	}
	return r.syncSlots(hosts, nowMs)
}

// syncSlots applies s.sync (the candidates, in hosts' order) to the slot
// table and gives hosts their slots. On failure the hosts keep the slots
// they had (new ones get none) and the next Housekeep tries again.
func (r *Dispatcher) syncSlots(hosts []scorer.Host, nowMs int64) SlotReport {
	s := &r.slots
	var fate func(index.Departed) index.Fate
	if s.pushed {
		if s.departedAt == nil {
			s.departedAt = map[index.HostRef]int64{}
		}
		// Only pushed state speaks for the gateway's candidates: a worker
		// on static endpoints frees nothing (another plugin sharing the
		// vm_id may route to the slots it does not know).
		s.fateNow = nowMs
		s.kept = s.kept[:0]
		fate = s.slotFate
	}
	refs, res, err := r.ix.Sync(s.sync, s.refs, fate)
	s.refs = refs
	s.due = res.Kept > 0 && s.pushed
	if s.pushed {
		s.forgetDepartures()
	}
	if err != nil {
		s.due = true
	}
	for i := range hosts {
		h := &hosts[i]
		if ref := refs[i]; err == nil || ref.Slot >= 0 {
			h.Slot, h.Gen = ref.Slot, ref.Gen
		}
		if h.Slot >= 0 && h.Slot < len(s.gens) && s.gens[h.Slot] != h.Gen {
			// Another host than this worker last saw holds the slot: what
			// the dispatcher learned about the previous one must not carry
			// over.
			if s.gens[h.Slot] != 0 {
				r.forgetSlot(h.Slot)
			}
			s.gens[h.Slot] = h.Gen
		}
	}
	s.seq = r.ix.SlotSeq()
	return SlotReport{Freed: res.Freed, Unassigned: res.Unassigned, Err: err}
}

// slotFate is what syncSlots does with the slot of a host that left the
// pushed candidate set: free it once nothing is in flight on it, or after
// SlotGraceMs; meanwhile offer it to a new host that finds the table full.
// The grace is timed from when this worker first saw the slot departed.
func (s *slotTable) slotFate(d index.Departed) index.Fate {
	if d.InFlight == 0 {
		return index.FreeSlot
	}
	since, ok := s.departedAt[d.Ref]
	if !ok {
		since = s.fateNow
	}
	if s.fateNow-since >= SlotGraceMs {
		return index.FreeSlot
	}
	s.kept = append(s.kept, departure{d.Ref, since})
	return index.ReuseSlot
}

// forgetDepartures keeps in departedAt only the slots the last Sync kept.
func (s *slotTable) forgetDepartures() {
	clear(s.departedAt)
	for _, d := range s.kept {
		s.departedAt[d.ref] = d.since
	}
}
