package index

// Per-host load counters, shared by every worker: one shared-data key
// holding, per slot, the generation it counts for and four counters. One
// key keeps the scorer's read to one copy per request; the writes (two or
// three per request) are CAS updates with bounded retries.

// Load is one host's outstanding work as dispatched by all workers of the
// gateway. Balancing by tokens, not requests, is the point: a host with
// few long prompts is busier than one with many short ones.
type Load struct {
	// InFlight counts requests dispatched and not finished.
	InFlight uint32
	// PrefillTokens counts prompt tokens dispatched whose prefill has not
	// finished (estimated, less the tokens the index expected cached).
	PrefillTokens uint32
	// DecodeTokens counts decode tokens outstanding (max_tokens or an
	// estimate, for requests not finished).
	DecodeTokens uint32
	// KVTokens counts the KV cache tokens that requests dispatched and not
	// finished will occupy (prompt plus max tokens): Dynamo's "active
	// blocks", shared across workers.
	KVTokens uint32
}

// LoadTicket is what one request added to a host's counters. Release
// subtracts exactly that, once: a second Release (a reset stream after a
// normal end, say) does nothing. The zero LoadTicket is released.
type LoadTicket struct {
	ref                           HostRef
	inflight, prefill, decode, kv uint32
}

// Active reports whether the ticket still holds counts to release.
func (t *LoadTicket) Active() bool { return t.inflight|t.prefill|t.decode|t.kv != 0 }

// Host returns the host the ticket counts against.
func (t *LoadTicket) Host() HostRef { return t.ref }

// AddLoad counts one request dispatched to ref's host with the given
// prompt tokens still to prefill and decode tokens outstanding.
func (ix *Index) AddLoad(ref HostRef, prefillTokens, decodeTokens int) (LoadTicket, error) {
	return ix.AddLoadKV(ref, prefillTokens, decodeTokens, 0)
}

// AddLoadKV is AddLoad that also counts kvTokens, the KV cache tokens the
// request will occupy until it finishes (prompt plus max tokens).
func (ix *Index) AddLoadKV(ref HostRef, prefillTokens, decodeTokens, kvTokens int) (t LoadTicket, err error) {
	// The slot table is the authority on generations: a ref it accepts
	// owns the slot, and counts stored under any other generation belong
	// to a previous host (or a bad value) and are reset.
	if ix.table.check(ref) != nil {
		err = ix.recheck(ref)
	}
	if err == nil {
		t = LoadTicket{ref: ref, inflight: 1, prefill: clampU32(prefillTokens), decode: clampU32(decodeTokens), kv: clampU32(kvTokens)}
		if err = ix.updateLoad(ref, &t, true); err != nil {
			t = LoadTicket{}
		}
	}
	return t, err // one return: each would copy the ticket
}

// recheck reads the slot table again and checks ref against it: the table this
// VM last read may predate the host's registration. Out of AddLoadKV, which
// runs for every request, because this is rare: each function entered costs a
// request (docs/performance.md).
func (ix *Index) recheck(ref HostRef) error {
	ix.readSlots()
	return ix.table.check(ref)
}

// PrefillDone subtracts the ticket's prefill tokens (the first token came
// back) and keeps the rest for Release.
func (ix *Index) PrefillDone(t *LoadTicket) error {
	if t.prefill == 0 {
		return nil
	}
	part := LoadTicket{ref: t.ref, prefill: t.prefill}
	if err := ix.updateLoad(t.ref, &part, false); err != nil {
		return err
	}
	t.prefill = 0
	return nil
}

// Release subtracts what the ticket still holds. It is idempotent: once it
// succeeded the ticket is empty. On error the ticket keeps its counts, so
// the caller may call Release again.
func (ix *Index) Release(t *LoadTicket) error {
	var err error // one return: in Wasm each return site costs code
	if t.Active() {
		if err = ix.updateLoad(t.ref, t, false); err == nil {
			t.inflight, t.prefill, t.decode, t.kv = 0, 0, 0, 0
		}
	}
	return err
}

func clampU32(n int) uint32 {
	if n <= 0 {
		return 0
	}
	if uint(n) > 1<<31 {
		return 1 << 31
	}
	return uint32(n)
}

// updateLoad adds d's counts to ref's record of the load counters (add)
// or subtracts them, under CAS.
func (ix *Index) updateLoad(ref HostRef, d *LoadTicket, add bool) error {
	if ref.Slot < 0 || ref.Slot >= MaxSlots {
		return ErrStaleHost
	}
	// An add right after Loads (Router.Decide: Loads, then AddLoad for the
	// chosen host) starts from the value and CAS Loads read instead of
	// getting the key again: if another worker wrote it since, the CAS
	// rejects the set and the retry reads it afresh.
	reuse := add && ix.loadFresh
	ix.loadFresh = false
	for attempt := 0; attempt < ix.cfg.CASRetries*4; attempt++ {
		v, cas, found := ix.loadBuf, ix.loadCAS, ix.loadFound
		if attempt > 0 || !reuse {
			v, cas, found = ix.getInto(&ix.loadBuf, ix.loadKey)
		}
		var out []byte
		if found && validLoad(v) && ref.Slot < int(le.Uint16(v[4:])) {
			// The slot is there: edit the value read (this update's own
			// copy) in place, to the same bytes a rebuild would give.
			v[3], v[6], v[7] = 0, 0, 0
			out = v
		} else {
			out = ix.growLoad(v, found, ref.Slot+1)
		}
		r := out[loadHeader+ref.Slot*loadRecord:][:loadRecord] // known length: fewer bounds checks
		if le.Uint32(r) != ref.Gen {
			if !add {
				// Releasing for an older incarnation whose counts were
				// reset: nothing to do, and the ticket is spent.
				return nil
			}
			resetLoad(r, ref.Gen)
		}
		for i, x := range [4]uint32{d.inflight, d.prefill, d.decode, d.kv} {
			c := le.Uint32(r[4+4*i:])
			if add {
				if c+x < c {
					c = ^uint32(0)
				} else {
					c += x
				}
			} else if x > c {
				c = 0
			} else {
				c -= x
			}
			le.PutUint32(r[4+4*i:], c)
		}
		retry, err := ix.set(ix.loadKey, out, cas)
		if retry {
			continue
		}
		return err
	}
	ix.metrics.CASFailures++
	return ErrContended
}

// growLoad builds in ix.enc a load value of size slots from the slots of v
// (none when v was not found or is corrupt, which it counts), the new slots
// zero. It is out of updateLoad because it runs only the first time a slot is
// counted: each function entered costs a request (docs/performance.md), so the
// hot path stays small (hence noinline: inlined, its appends would be most of
// updateLoad's code).
//
//go:noinline
func (ix *Index) growLoad(v []byte, found bool, size int) []byte {
	n := 0
	if found {
		if validLoad(v) {
			n = int(le.Uint16(v[4:]))
		} else {
			ix.metrics.Corrupt++
		}
	}
	ix.enc = append(ix.enc[:0], loadMagic0, loadMagic1, formatVersion, 0)
	ix.enc = le.AppendUint16(ix.enc, uint16(size))
	ix.enc = append(ix.enc, 0, 0)
	if n > 0 {
		ix.enc = append(ix.enc, v[loadHeader:loadHeader+n*loadRecord]...)
	}
	for len(ix.enc) < loadHeader+size*loadRecord {
		ix.enc = append(ix.enc, 0)
	}
	return ix.enc
}

// resetLoad starts record r afresh for incarnation gen (the first request
// of a new host in the slot); out of updateLoad for the same reason as
// growLoad.
func resetLoad(r []byte, gen uint32) {
	le.PutUint32(r, gen)
	clear(r[4:loadRecord])
}

func validLoad(v []byte) bool {
	if len(v) < loadHeader || v[0] != loadMagic0 || v[1] != loadMagic1 || v[2] != formatVersion {
		return false
	}
	n := int(le.Uint16(v[4:]))
	return n <= MaxSlots && len(v) == loadHeader+n*loadRecord
}

// Loads reads every host's counters into dst (indexed by slot, resized to
// the slot table as of the last table read by Query, Lookup or Record).
// Slots whose counters belong to an older incarnation read as zero. The
// value read is kept for the next AddLoad (see updateLoad), which then
// skips its own read of the key.
func (ix *Index) Loads(dst []Load) []Load {
	n := ix.table.n
	if cap(dst) < n {
		dst = make([]Load, n, MaxSlots)
	}
	dst = dst[:n]
	clear(dst)
	v, cas, found := ix.getInto(&ix.loadBuf, ix.loadKey)
	ix.loadFresh, ix.loadCAS, ix.loadFound = true, cas, found
	m := 0 // the slots the value holds
	if found {
		if validLoad(v) {
			m = int(le.Uint16(v[4:]))
		} else {
			ix.metrics.Corrupt++
		}
	}
	for s := 0; s < n && s < m; s++ {
		// One record, of known length: its fields read without a bounds
		// check each (code every routed request enters, in Wasm).
		r := v[loadHeader+s*loadRecord:][:loadRecord]
		if rec := &ix.table.recs[s]; rec.addrHash == 0 || le.Uint32(r) != rec.gen {
			continue
		}
		dst[s] = Load{InFlight: le.Uint32(r[4:]), PrefillTokens: le.Uint32(r[8:]), DecodeTokens: le.Uint32(r[12:]), KVTokens: le.Uint32(r[16:])}
	}
	return dst
}
