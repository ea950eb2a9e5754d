package index

import (
	"slices"
)

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
	if start >= len(blocks) {
		return nil
	}
	return ix.mark(ref, blocks[start:], start, true)
}

// Stored records precise engine state: ref's host holds blocks, which are
// chain positions start, start+1, ... (the position sets a block's weight
// under multi-resolution hashing).
func (ix *Index) Stored(ref HostRef, blocks []uint64, start int) error {
	return ix.mark(ref, blocks, start, true)
}

// Removed records that ref's host evicted blocks (chain positions start,
// start+1, ...).
func (ix *Index) Removed(ref HostRef, blocks []uint64, start int) error {
	return ix.mark(ref, blocks, start, false)
}

// mark sets (add) or clears the host's bit for blocks at chain positions
// start+i, one CAS update per shard touched, then books the change in the
// host's usage histogram and evicts past its capacity.
func (ix *Index) mark(ref HostRef, blocks []uint64, start int, add bool) error {
	if len(blocks) == 0 {
		return nil
	}
	ix.readSlots()
	if err := ix.table.check(ref); err != nil {
		return err
	}
	// Group by shard: sort (shard, position) pairs packed in a uint64.
	ix.order = ix.order[:0]
	for i, h := range blocks {
		ix.order = append(ix.order, uint64(shardOf(h, ix.shardBits))<<32|uint64(i))
	}
	slices.Sort(ix.order)
	now := ix.nowAge()
	ix.pending = ix.pending[:0]
	var firstErr error
	for g := 0; g < len(ix.order); {
		sh := int(ix.order[g] >> 32)
		e := g + 1
		for e < len(ix.order) && int(ix.order[e]>>32) == sh {
			e++
		}
		if err := ix.updateShard(ref, sh, blocks, start, ix.order[g:e], now, add); err != nil && firstErr == nil {
			firstErr = err
		}
		g = e
	}
	if len(ix.pending) > 0 {
		if err := ix.bookUsage(ref, now); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

// updateShard applies one host's changes to one shard under CAS.
func (ix *Index) updateShard(ref HostRef, sh int, blocks []uint64, start int, group []uint64, now uint32, add bool) error {
	key := ix.shardKeys[sh]
	t := &ix.table
	word, bit := ref.Slot/64, uint64(1)<<(ref.Slot%64)
	bucketTicks := uint32(ix.cfg.BucketMs >> ageShift)
	if bucketTicks == 0 {
		bucketTicks = 1
	}
	for attempt := 0; attempt < ix.cfg.CASRetries; attempt++ {
		v, cas, found := ix.get(key)
		dirty, words, newer := ix.loadEntries(v, found)
		if newer {
			// A writer with a newer slot table rewrote this shard: our table
			// may still list a host that was removed since. Refresh it and
			// retry, so a dead host's bit is never stamped valid.
			ix.readSlots()
			if err := t.check(ref); err != nil {
				return err
			}
			continue
		}
		ix.deltas = ix.deltas[:0]
		for _, o := range group {
			i := int(uint32(o))
			pos := start + i
			level := ix.level(pos)
			units := int32(1) << level
			tag := blockTag(blocks[i], level)
			k := -1
			for j := range ix.ent {
				if ix.ent[j].tag == tag {
					k = j
					break
				}
			}
			if !add {
				if k >= 0 && ix.ent[k].bits[word]&bit != 0 {
					ix.ent[k].bits[word] &^= bit
					ix.deltas = append(ix.deltas, usageDelta{ix.ent[k].age / bucketTicks, -units})
					dirty = true
				}
				continue
			}
			if k < 0 {
				if len(ix.ent) >= ix.cfg.ShardEntries {
					ix.evictOldest()
				}
				ix.ent = append(ix.ent, entry{tag: tag, age: now})
				k = len(ix.ent) - 1
				ix.ent[k].bits[word] |= bit
				ix.deltas = append(ix.deltas, usageDelta{now / bucketTicks, units})
				dirty = true
				continue
			}
			en := &ix.ent[k]
			if en.bits[word]&bit == 0 {
				en.bits[word] |= bit
				ix.deltas = append(ix.deltas, usageDelta{now / bucketTicks, units})
				en.age = now
				dirty = true
			} else if en.age != now {
				// A refresh moves the block's units to the current bucket.
				ix.deltas = append(ix.deltas, usageDelta{en.age / bucketTicks, -units}, usageDelta{now / bucketTicks, units})
				en.age = now
				dirty = true
			}
		}
		if !dirty {
			return nil
		}
		// Drop entries left with no host.
		kept := ix.ent[:0]
		for _, en := range ix.ent {
			if !isZero(en.bits) {
				kept = append(kept, en)
			}
		}
		ix.ent = kept
		ix.enc = encodeShard(ix.enc, ix.ent, max(words, t.words()), t.epoch)
		retry, err := ix.set(key, ix.enc, cas)
		if retry {
			continue
		}
		if err != nil {
			return err
		}
		ix.pending = append(ix.pending, ix.deltas...)
		return nil
	}
	ix.metrics.CASFailures++
	return ErrContended
}

// loadEntries decodes a shard value into ix.ent, dropping bits that no
// longer count (removed or cleared slots, expired past a host's horizon).
// Bits of slots beyond our table (hosts registered since we read it) are
// kept. It reports whether the value needs rewriting even with no other
// change, the bitmap words it used, and whether it was written with a
// newer slot table than ours.
func (ix *Index) loadEntries(v []byte, found bool) (dirty bool, words int, newer bool) {
	ix.ent = ix.ent[:0]
	if !found {
		return false, 0, false
	}
	view, ok := parseShard(v)
	if !ok {
		ix.metrics.Corrupt++
		return true, 0, false
	}
	t := &ix.table
	if int32(view.epoch-t.epoch) > 0 {
		return false, 0, true
	}
	stale := t.staleMask(view.epoch)
	if view.epoch != t.epoch {
		dirty = !isZero(stale) // rewrite to stamp the new epoch only if bits go
	}
	for i := 0; i < view.n; i++ {
		en := entry{tag: le.Uint32(view.buf[shardHeader+i*view.stride:]), age: view.age(i), bits: view.bitmap(i)}
		b := andNot(en.bits, stale)
		if t.anyHorz {
			b = t.dropExpired(b, en.age)
		}
		if b != en.bits {
			dirty = true
		}
		if isZero(b) {
			continue
		}
		en.bits = b
		ix.ent = append(ix.ent, en)
	}
	if len(ix.ent) > ix.cfg.ShardEntries {
		for len(ix.ent) > ix.cfg.ShardEntries {
			ix.evictOldest()
		}
		dirty = true
	}
	return dirty, view.words, false
}

// evictOldest drops the least recently used entry of the shard. The hosts
// that held it are not debited in their usage histograms (that would cost
// a write per host); the index is sized so this is rare, and counted.
func (ix *Index) evictOldest() {
	now := ix.nowAge()
	old, oldest := -1, uint32(0)
	for j := range ix.ent {
		if a := now - ix.ent[j].age; old < 0 || a > oldest {
			old, oldest = j, a
		}
	}
	last := len(ix.ent) - 1
	ix.ent[old] = ix.ent[last]
	ix.ent = ix.ent[:last]
	ix.metrics.Overflows++
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
