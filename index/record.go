package index

import "slices"

// Record marks ref's host as holding the whole chain blocks after routing
// a request there (for prefill/decode, call it for both hosts).
//
// m, when non-nil, is the Query answer for the same chain: blocks the host
// already held whose recency was refreshed less than Config.TouchAfterMs
// ago are then skipped, so a repeated prompt costs no shard writes. With a
// nil m every block is written or refreshed.
func (ix *Index) Record(ref HostRef, blocks []uint64, m *Matches) error {
	ix.metrics.Records++
	start := 0
	if m != nil && m.length == len(blocks) && len(blocks) > 0 && m.chain == blocks[0] &&
		ref.Slot >= 0 && ref.Slot < len(m.Blocks) {
		if held := m.Blocks[ref.Slot]; held > 0 {
			touchAfter := uint32(ix.cfg.TouchAfterMs >> ageShift)
			if ix.nowAge()-m.ages[ref.Slot] < touchAfter {
				start = held
			}
		}
	}
	var err error // one return: in Wasm each return site costs code
	if start < len(blocks) {
		err = ix.recordFrom(ref, blocks, start, m)
	}
	return err
}

// recordFrom is Record once it has blocks to write: chain[start:], plus the
// shared hint. It is out of Record (hence noinline) because a repeated prompt,
// whose blocks the host holds and refreshed recently, writes nothing: each
// function entered costs a request (docs/performance.md), and the write path
// is most of Record's.
//
//go:noinline
func (ix *Index) recordFrom(ref HostRef, blocks []uint64, start int, m *Matches) error {
	ix.tableFresh = m != nil && m.table == ix.table.epoch && m.length == len(blocks)
	ix.q.reusable = ix.tableFresh && m.query == ix.metrics.Queries && m.chain == blocks[0]
	err := ix.mark(ref, blocks, start, true)
	ix.q.reusable = false
	if err == nil && ix.useSharedHints(len(blocks)) {
		ix.publishHint(blocks)
	}
	return err
}

// Stored records precise engine state: ref's host holds chain[from:].
// chain is the whole chain from its first block (a block's shard and
// weight depend on its position and its segment's first block).
func (ix *Index) Stored(ref HostRef, chain []uint64, from int) error {
	return ix.mark(ref, chain, from, true)
}

// Removed records that ref's host evicted chain[from:]; to remove blocks
// i..j-1 in the middle of a chain, pass chain[:j] and i.
func (ix *Index) Removed(ref HostRef, chain []uint64, from int) error {
	return ix.mark(ref, chain, from, false)
}

// mark sets (add) or clears the host's bit for chain[from:], one CAS
// update per shard touched, then books the change in the host's usage
// histogram and evicts past its capacity.
func (ix *Index) mark(ref HostRef, chain []uint64, from int, add bool) error {
	if from < 0 {
		from = 0
	}
	if from >= len(chain) {
		return nil
	}
	// Right after a Query (Record with its Matches) the slot table it read
	// is reused: a table a few microseconds stale is safe, since a shard
	// written with an older table epoch masks the bits of any host removed
	// since (see updateShard and staleMask).
	if !ix.tableFresh {
		ix.refreshSlots()
	}
	ix.tableFresh = false
	if ix.table.check(ref) != nil {
		// The stamp may be behind a Register another VM just made: ask
		// the table itself before calling the reference stale.
		ix.readSlots()
		if err := ix.table.check(ref); err != nil {
			return err
		}
	}
	// One shard update per segment: a segment's blocks share a shard.
	// (Two segments of one chain rarely share a shard; they then cost two
	// updates, which is cheaper than sorting to merge them.)
	now := ix.nowAge()
	ix.pending = ix.pending[:0]
	var firstErr error
	seg := ix.cfg.SegmentBlocks
	for lo := from; lo < len(chain); {
		hi := min(lo&^(seg-1)+seg, len(chain))
		if err := ix.updateShard(ref, ix.shardAt(chain, lo), chain, lo, hi, now, add); err != nil && firstErr == nil {
			firstErr = err
		}
		lo = hi
	}
	if len(ix.pending) > 0 {
		if _, err := ix.bookUsage(ref, now, 0, 0); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

// updateShard applies one host's changes to one shard under CAS. It edits
// the copy Get returned in place (header, then fixed-stride entries):
// decoding a 64-entry shard into structures and encoding it back cost
// more than the shared-data round trip.
func (ix *Index) updateShard(ref HostRef, sh int, chain []uint64, lo, hi int, now uint32, add bool) error {
	key := ix.shardKeys[sh]
	t := &ix.table
	bt := ix.bucketTicks()
	refreshed := false
	for attempt := 0; attempt < ix.cfg.CASRetries; attempt++ {
		var v []byte
		var cas uint32
		var found, reused bool
		if attempt == 0 {
			v, cas, found, reused = ix.queriedShard(sh)
		}
		if !reused {
			v, cas, found = ix.getInto(&ix.shardBuf, key)
		}
		var view shardView
		ok := false
		if found {
			// Readers binary-search the tags; a value whose tags are not
			// strictly increasing was not written by the index: replace it.
			if view, ok = parseShard(v); !ok || !view.sorted() {
				ok, view = false, shardView{}
				ix.metrics.Corrupt++
			}
		}
		if ok && int32(view.epoch-t.epoch) > 0 {
			if !refreshed {
				// A writer with a newer slot table rewrote this shard: our
				// table may still list a host that was removed since.
				// Refresh it and retry, so a dead host's bit is never
				// stamped valid.
				refreshed = true
				ix.readSlots()
				if err := t.check(ref); err != nil {
					return err
				}
				continue
			}
			// Still ahead of the freshest table: epochs come only from the
			// table, so this value is bogus. Replace it.
			ix.metrics.Corrupt++
			ok, view = false, shardView{}
		}
		dirty := found && !ok // a corrupt value is replaced
		// Edit the value read in place when its bitmaps are wide enough:
		// it is this update's own copy (ix.shardBuf, a fresh slice from
		// Get, or the Query's copy that queriedShard handed over), read
		// again on a retry. Otherwise widen it into ix.work.
		words := max(t.words(), 1)
		fromWork := false
		var buf []byte
		if ok && view.words >= words {
			words = view.words
			buf = v
		} else {
			ix.work = widenShard(ix.work, view, words)
			buf, fromWork = ix.work, true
		}
		e := shardEdit{buf: buf, words: words, stride: 8 + 8*words, n: view.n}
		// Bits of hosts removed since the shard was written must go before
		// the new epoch is stamped: a full pass, rare. Bits past a host's
		// horizon are ignored by readers, so they are dropped lazily: from
		// an entry this update refreshes (the refresh would revive them),
		// and from the whole shard when it needs room.
		cleaned := false
		if ok && !isZero(t.staleMask(view.epoch)) {
			ix.cleanShard(&e, view.epoch)
			e.compact()
			dirty, cleaned = true, true
		}
		needCompact := false
		overflows := uint64(0)
		word, bit := ref.Slot/64, uint64(1)<<(ref.Slot%64)
		ix.deltas = ix.deltas[:0]
		ix.ins = ix.ins[:0]
		// Visit the segment's blocks in tag order with one forward walk
		// over the sorted entries: cheaper than a binary search per block,
		// whose branches a CPU cannot predict. Entries do not move during
		// the walk (new ones are merged in after it).
		ix.seg = ix.seg[:0]
		for pos := lo; pos < hi; pos++ {
			level := ix.level(pos)
			ix.seg = append(ix.seg, segBlock{tag: blockTag(chain[pos], level), units: int32(1) << level})
		}
		sortSeg(ix.seg)
		k := 0
		for _, sb := range ix.seg {
			tag, units := sb.tag, sb.units
			for k < e.n && le.Uint32(e.buf[e.off(k):]) < tag {
				k++
			}
			found := k < e.n && le.Uint32(e.buf[e.off(k):]) == tag
			if !add {
				if found && e.word(k, word)&bit != 0 {
					e.setWord(k, word, e.word(k, word)&^bit)
					ix.deltas = append(ix.deltas, usageDelta{e.age(k) / bt, -units})
					dirty = true
					needCompact = needCompact || e.empty(k)
				}
				continue
			}
			if !found {
				// New entries are merged in after the loop, in one pass
				// (inserting them one by one shifts the shard each time).
				// The walk is in tag order: a repeated tag follows itself.
				if len(ix.ins) == 0 || ix.ins[len(ix.ins)-1] != tag {
					ix.ins = append(ix.ins, tag)
					ix.deltas = append(ix.deltas, usageDelta{now / bt, units})
					dirty = true
				}
				continue
			}
			if t.anyHorz && e.clean(k, t, nil) {
				dirty = true
			}
			if w := e.word(k, word); w&bit == 0 {
				e.setWord(k, word, w|bit)
				e.setAge(k, now)
				ix.deltas = append(ix.deltas, usageDelta{now / bt, units})
				dirty = true
			} else if old := e.age(k); old != now {
				// A refresh moves the block's units to the current bucket.
				e.setAge(k, now)
				ix.deltas = append(ix.deltas, usageDelta{old / bt, -units}, usageDelta{now / bt, units})
				dirty = true
			}
		}
		if !dirty {
			return nil
		}
		if reused {
			// Edited in place: the Query's copy no longer matches its CAS.
			ix.forgetShard(sh)
		}
		// Drop entries left with no host; trim a shard written under a
		// larger ShardEntries.
		if needCompact {
			e.compact()
		}
		if len(ix.ins) > 0 {
			if e.n+len(ix.ins) > ix.cfg.ShardEntries && !cleaned && t.anyHorz {
				// Full: first drop what has expired.
				if ix.cleanShard(&e, view.epoch) {
					e.compact()
				}
			}
			for e.n > 0 && e.n+len(ix.ins) > ix.cfg.ShardEntries {
				e.remove(e.oldest(now))
				overflows++
			}
			e.merge(ix.ins, now, word, bit)
		}
		for e.n > ix.cfg.ShardEntries {
			e.remove(e.oldest(now))
			overflows++
		}
		out := e.finish(t.epoch)
		// Keep a buffer merge grew for the next update.
		if fromWork {
			ix.work = out
		} else if !reused {
			ix.shardBuf = out
		}
		retry, err := ix.set(key, out, cas)
		if retry {
			continue
		}
		if err != nil {
			return err
		}
		// Counted once written: an attempt that lost the CAS dropped
		// nothing.
		ix.metrics.Overflows += overflows
		ix.pending = append(ix.pending, ix.deltas...)
		return nil
	}
	ix.metrics.CASFailures++
	return ErrContended
}

// segBlock is one block of a shard update: its entry tag and weight.
type segBlock struct {
	tag   uint32
	units int32
}

// sortSeg sorts a segment's blocks by tag (insertion sort: a segment is
// a few blocks).
func sortSeg(s []segBlock) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j].tag < s[j-1].tag; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// cleanShard drops the bits that no longer count: slots removed or
// cleared after the shard was last written, and entries older than a
// host's eviction horizon. It reports whether anything changed.
func (ix *Index) cleanShard(e *shardEdit, shardEpoch uint32) (changed bool) {
	t := &ix.table
	stale := t.staleMask(shardEpoch)
	var mask *[maxWords]uint64
	if !isZero(stale) {
		mask = &stale
	} else if !t.anyHorz {
		return false
	}
	for i := 0; i < e.n; i++ {
		if e.clean(i, t, mask) {
			changed = true
		}
	}
	return changed
}

// clean drops from entry i the bits of the slots in stale (nil: none)
// and of hosts whose eviction horizon passed the entry's age, one bitmap
// word at a time in place: a full shard is cleaned whenever it needs
// room, so this runs for every entry of it. It reports whether a bit
// was dropped.
func (e *shardEdit) clean(i int, t *slotTable, stale *[maxWords]uint64) (changed bool) {
	off := e.off(i)
	age := le.Uint32(e.buf[off+4:])
	// An entry refreshed at or after the latest horizon keeps every bit:
	// most entries are skipped without reading their bitmap.
	expire := t.anyHorz && int32(age-t.maxHorz) < 0
	if !expire && stale == nil {
		return false
	}
	for w := 0; w < e.words; w++ {
		p := off + 8 + 8*w
		x := le.Uint64(e.buf[p:])
		nx := x
		if stale != nil {
			nx &^= stale[w]
		}
		if expire && nx != 0 {
			nx = t.dropExpiredWord(w, nx, age)
		}
		if nx != x {
			le.PutUint64(e.buf[p:], nx)
			changed = true
		}
	}
	return changed
}

// shardEdit edits a shard value in place.
type shardEdit struct {
	buf    []byte
	words  int
	stride int
	n      int
}

func (e *shardEdit) off(i int) int          { return shardHeader + i*e.stride }
func (e *shardEdit) age(i int) uint32       { return le.Uint32(e.buf[e.off(i)+4:]) }
func (e *shardEdit) setAge(i int, a uint32) { le.PutUint32(e.buf[e.off(i)+4:], a) }
func (e *shardEdit) word(i, w int) uint64   { return le.Uint64(e.buf[e.off(i)+8+8*w:]) }
func (e *shardEdit) setWord(i, w int, x uint64) {
	le.PutUint64(e.buf[e.off(i)+8+8*w:], x)
}

func (e *shardEdit) empty(i int) bool {
	for w := 0; w < e.words; w++ {
		if e.word(i, w) != 0 {
			return false
		}
	}
	return true
}

// oldest returns the least recently refreshed entry.
func (e *shardEdit) oldest(now uint32) int {
	old, oldest := 0, uint32(0)
	for i := 0; i < e.n; i++ {
		if a := now - e.age(i); i == 0 || a > oldest {
			old, oldest = i, a
		}
	}
	return old
}

// compact drops the entries that no host holds, keeping the order.
func (e *shardEdit) compact() {
	kept := 0
	for i := 0; i < e.n; i++ {
		if e.empty(i) {
			continue
		}
		if kept != i {
			copy(e.buf[e.off(kept):e.off(kept)+e.stride], e.buf[e.off(i):e.off(i)+e.stride])
		}
		kept++
	}
	e.n = kept
	e.buf = e.buf[:e.off(e.n)]
}

// remove drops entry i, keeping the order.
func (e *shardEdit) remove(i int) {
	copy(e.buf[e.off(i):], e.buf[e.off(i+1):e.off(e.n)])
	e.n--
	e.buf = e.buf[:e.off(e.n)]
}

// merge adds entries for tags (none present yet, no duplicates; sorted
// here if they are not) holding only bit in word w, in one backward pass
// over the shard: for each new tag, largest first, the entries above it
// move up by its rank in one copy, and it is written below them.
func (e *shardEdit) merge(tags []uint32, age uint32, w int, bit uint64) {
	if !slices.IsSorted(tags) {
		slices.Sort(tags)
	}
	n, k := e.n, len(tags)
	end := e.off(n + k)
	if cap(e.buf) < end {
		grown := make([]byte, e.off(n), end+end/2)
		copy(grown, e.buf[:e.off(n)])
		e.buf = grown
	}
	e.buf = e.buf[:end]
	hi := n // entries [0, hi) have not moved yet
	for j := k - 1; j >= 0; j-- {
		lo := hi
		for lo > 0 && le.Uint32(e.buf[e.off(lo-1):]) > tags[j] {
			lo--
		}
		if lo < hi { // entries [lo, hi) sit above tags[j] and j new ones
			copy(e.buf[e.off(lo+j+1):e.off(hi+j+1)], e.buf[e.off(lo):e.off(hi)])
		}
		hi = lo
		off := e.off(lo + j)
		le.PutUint32(e.buf[off:], tags[j])
		le.PutUint32(e.buf[off+4:], age)
		for x := 0; x < e.words; x++ {
			var v uint64
			if x == w {
				v = bit
			}
			le.PutUint64(e.buf[off+8+8*x:], v)
		}
	}
	e.n = n + k
}

// finish writes the header and returns the value to store.
func (e *shardEdit) finish(epoch uint32) []byte {
	e.buf = e.buf[:e.off(e.n)]
	e.buf[0], e.buf[1], e.buf[2], e.buf[3] = shardMagic0, shardMagic1, formatVersion, byte(e.words)
	le.PutUint32(e.buf[4:], epoch)
	le.PutUint16(e.buf[8:], uint16(e.n))
	e.buf[10], e.buf[11] = 0, 0
	return e.buf
}

// widenShard copies view's entries into dst with words bitmap words each
// (view may be empty), leaving room for the header.
func widenShard(dst []byte, view shardView, words int) []byte {
	dst = append(dst[:0], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0) // header, written by finish
	for i := 0; i < view.n; i++ {
		off := shardHeader + i*view.stride
		dst = append(dst, view.buf[off:off+8]...)
		m := view.bitmap(i)
		for w := 0; w < words; w++ {
			dst = le.AppendUint64(dst, m[w])
		}
	}
	return dst
}

func encodeShard(dst []byte, ent []entry, words int, epoch uint32) []byte {
	if len(ent) == 0 {
		words = 0
	} else if words == 0 {
		words = 1
	}
	dst = append(dst[:0], shardMagic0, shardMagic1, formatVersion, byte(words))
	dst = le.AppendUint32(dst, epoch)
	dst = le.AppendUint16(dst, uint16(len(ent)))
	dst = append(dst, 0, 0)
	for i := range ent {
		dst = le.AppendUint32(dst, ent[i].tag)
		dst = le.AppendUint32(dst, ent[i].age)
		for w := 0; w < words; w++ {
			dst = le.AppendUint64(dst, ent[i].bits[w])
		}
	}
	return dst
}
