package index

// Applying a candidate set to the slot table in one write.
//
// Pods come and go for ever (a Kubernetes deployment churns through
// addresses in days), and the table holds MaxSlots hosts: a slot whose host
// left the candidate set must be freed, or after MaxSlots distinct addresses
// every new host goes without prefix matching and shared load accounting.
// Shared-data keys cannot be deleted in Envoy, so the table, the per-slot
// usage keys and the load key are reused, never grown past MaxSlots: a
// freed slot's bits stop counting at once for every reader (its clear
// epoch, see staleMask) and its usage and load records start afresh under
// the next generation, so nothing of the departed host carries over.
//
// Several workers apply the same push, each with its own Index: Sync
// decides everything from the table it read, inside the CAS loop, so two
// workers racing on one push write one consistent table (the second finds
// the first's work done and writes nothing).

// SyncHost is one host of the candidate set handed to Sync.
type SyncHost struct {
	Addr string
	// CapacityTokens is the host's KV cache in prompt tokens (see
	// SetCapacity), 0 for unbounded, negative to leave it as it is.
	CapacityTokens int
	// Clear forgets every block the host holds (see Clear).
	Clear bool
}

// Departed is a slot whose address is not in the candidate set.
type Departed struct {
	Ref HostRef
	// InFlight is the requests the gateway's workers still count on the
	// slot (the shared load counters).
	InFlight uint32
}

// Fate is what Sync does with a departed slot.
type Fate uint8

const (
	// KeepSlot leaves the slot to its host (the host may come back, or the
	// slot belongs to another plugin's candidates).
	KeepSlot Fate = iota
	// FreeSlot frees it now.
	FreeSlot
	// ReuseSlot frees it only if a new host needs a slot and none is free:
	// the hosts in the candidate set come before those that left it.
	ReuseSlot
)

// SyncResult says what one Sync did.
type SyncResult struct {
	// Registered counts hosts given a slot; Freed counts slots freed
	// (departed hosts, or reused for a new host); Kept counts departed
	// slots left in place (KeepSlot, or ReuseSlot not needed); Unassigned
	// counts hosts left without a slot (Slot -1: the table is full of
	// hosts in the candidate set or kept).
	Registered, Freed, Kept, Unassigned int
	// Wrote says the table was written.
	Wrote bool
}

// Sync brings the slot table to the candidate set hosts, in one read of
// the table and at most one CAS write whatever the number of hosts: every
// address gets a slot (refs[i], grown to len(hosts); Slot -1 when none is
// left), capacities and clears are applied, and each slot whose address is
// not in hosts meets the Fate that fate gives it (nil: KeepSlot). fate may
// be called again for the same slot when a concurrent writer forces a
// retry.
func (ix *Index) Sync(hosts []SyncHost, refs []HostRef, fate func(Departed) Fate) ([]HostRef, SyncResult, error) {
	if cap(refs) < len(hosts) {
		refs = make([]HostRef, len(hosts))
	}
	refs = refs[:len(hosts)]
	if ix.syncWant == nil {
		ix.syncWant = make(map[uint64]int32, len(hosts))
		ix.syncSlots = make(map[uint64]int32, MaxSlots)
	}
	clear(ix.syncWant)
	ix.syncHash = ix.syncHash[:0]
	for i := range hosts {
		h := addrHash(hosts[i].Addr)
		ix.syncHash = append(ix.syncHash, h)
		if _, dup := ix.syncWant[h]; !dup {
			ix.syncWant[h] = int32(i)
		}
	}
	var res SyncResult
	loadsRead := false
	err := ix.updateSlots(func(t *slotTable) (bool, error) {
		res = SyncResult{}
		ix.syncNew = ix.syncNew[:0]
		changed := false
		bumped := false
		clear(ix.syncSlots)
		for i := 0; i < t.n; i++ {
			if h := t.recs[i].addrHash; h != 0 {
				ix.syncSlots[h] = int32(i)
			}
		}
		gone := func(r *slotRec) { // the slot's bits, usage and load stop counting
			if !bumped {
				t.epoch++
				bumped = true
			}
			r.clearEpoch = t.epoch
			r.horizon = 0
		}
		// Departed slots: free now, keep, or offer for reuse.
		ix.syncReuse = ix.syncReuse[:0]
		for i := 0; i < t.n; i++ {
			r := &t.recs[i]
			if r.addrHash == 0 {
				continue
			}
			if _, ok := ix.syncWant[r.addrHash]; ok {
				continue
			}
			f := KeepSlot
			if fate != nil {
				if !loadsRead {
					// t is ix.table: Loads reads the counters for it.
					ix.syncLoads = ix.Loads(ix.syncLoads)
					ix.loadFresh = false // not read for an AddLoad
					loadsRead = true
				}
				d := Departed{Ref: HostRef{Slot: i, Gen: r.gen}}
				if i < len(ix.syncLoads) {
					d.InFlight = ix.syncLoads[i].InFlight
				}
				f = fate(d)
			}
			switch f {
			case FreeSlot:
				delete(ix.syncSlots, r.addrHash)
				r.addrHash = 0
				gone(r)
				res.Freed++
				changed = true
			case ReuseSlot:
				ix.syncReuse = append(ix.syncReuse, int32(i))
				res.Kept++
			default:
				res.Kept++
			}
		}
		// The candidates: find, or register, then capacity and clear.
		free := 0 // next slot to look at for a free one
		for i := range hosts {
			h := ix.syncHash[i]
			if j := ix.syncWant[h]; int(j) != i {
				// The address appears twice: give both the first's slot.
				refs[i] = refs[j]
				continue
			}
			slot := -1
			if k, ok := ix.syncSlots[h]; ok {
				slot = int(k)
			} else {
				for free < t.n && t.recs[free].addrHash != 0 {
					free++
				}
				switch {
				case free < t.n:
					slot = free
				case t.n < MaxSlots:
					slot = t.n
					t.recs[slot] = slotRec{}
					t.n++
				case len(ix.syncReuse) > 0:
					slot = int(ix.syncReuse[0])
					ix.syncReuse = ix.syncReuse[1:]
					delete(ix.syncSlots, t.recs[slot].addrHash)
					res.Kept--
					res.Freed++
				default:
					refs[i] = HostRef{Slot: -1}
					res.Unassigned++
					continue
				}
				r := &t.recs[slot]
				if r.gen != 0 {
					gone(r) // a used slot: its old bits must stop counting
				}
				r.gen++
				r.addrHash = h
				r.capacity = 0
				r.horizon = 0
				ix.syncSlots[h] = int32(slot)
				ix.syncNew = append(ix.syncNew, int32(i))
				res.Registered++
				changed = true
			}
			r := &t.recs[slot]
			refs[i] = HostRef{Slot: slot, Gen: r.gen}
			if c := hosts[i].CapacityTokens; c >= 0 {
				if u := ix.tokensToUnits(c); r.capacity != u {
					r.capacity = u
					changed = true
				}
			}
			if hosts[i].Clear {
				gone(r)
				changed = true
			}
		}
		res.Wrote = changed
		return changed, nil
	})
	if err != nil {
		// Nothing was written: the hosts this attempt registered have no
		// slot (the next Sync tries again); the others keep the slots the
		// table last read gave them.
		for _, i := range ix.syncNew {
			refs[i] = HostRef{Slot: -1}
		}
		res.Wrote = false
	}
	return refs, res, err
}

// SlotSeq returns the sequence number of the slot table, bumped by every
// write of it by any worker: a caller that kept the HostRefs of its hosts
// from a Sync needs to Sync again only when it moved.
func (ix *Index) SlotSeq() uint32 {
	ix.refreshSlots()
	return ix.table.seq
}
