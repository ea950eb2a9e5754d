package index

import (
	"encoding/binary"
	"math/bits"
)

// Shared-data value formats. All little endian, each value starting with a
// two-byte magic and a version byte, so a value from another program, an
// older release or a torn write is recognised and treated as empty (and
// counted) instead of misread. Values are small and fixed-stride: a reader
// inside Wasm scans them in place, without decoding into Go structures.

const (
	formatVersion = 1

	// MaxSlots is the number of host slots the index tracks. Bitmaps are
	// sized to the highest slot in use, so small fleets pay for what they use.
	MaxSlots = 256
	maxWords = MaxSlots / 64

	// Slot table: header, then one record per slot. Version 2 added seq.
	slotsMagic0, slotsMagic1 = 'K', 'S'
	slotsVersion             = 2
	slotsHeader              = 16 // magic(2) version(1) pad(1) epoch(4) n(2) pad(2) seq(4)
	slotRecord               = 24 // addrHash(8) gen(4) clearEpoch(4) capacity(4) horizon(4)

	// Slot table stamp: the seq of the latest slot table, so that a reader
	// holding that table decoded copies 8 bytes instead of the table.
	stampMagic0, stampMagic1 = 'K', 'V'
	stampLen                 = 8 // magic(2) version(1) pad(1) seq(4)

	// Block shard: header, then n entries of (tag, age, W bitmap words),
	// sorted by tag.
	shardMagic0, shardMagic1 = 'K', 'B'
	shardHeader              = 12 // magic(2) version(1) words(1) epoch(4) n(2) pad(2)

	// Per-host usage: header, then usageBuckets counters.
	usageMagic0, usageMagic1 = 'K', 'U'
	usageHeader              = 20 // magic(2) version(1) pad(1) gen(4) clearEpoch(4) head(4) total(4)

	// Load counters: header, then one record per slot.
	loadMagic0, loadMagic1 = 'K', 'L'
	loadHeader             = 8  // magic(2) version(1) pad(1) n(2) pad(2)
	loadRecord             = 20 // gen(4) inflight(4) prefill(4) decode(4) kv(4)
)

var le = binary.LittleEndian

// slotRec is one decoded slot of the host slot table.
type slotRec struct {
	addrHash   uint64 // 0: free
	gen        uint32 // incarnation; bumped each time the slot is reassigned
	clearEpoch uint32 // table epoch of the last removal/clear of this slot
	capacity   uint32 // capacity in units (level-0 blocks); 0: unbounded
	horizon    uint32 // entries older than this (ms clock) no longer count
}

// slotTable is the decoded host slot table.
type slotTable struct {
	epoch   uint32
	seq     uint32 // bumped on every write of the table (see the stamp)
	n       int
	recs    [MaxSlots]slotRec
	active  [maxWords]uint64
	maxGone uint32 // max clearEpoch over all slots
	anyHorz bool   // some slot has a nonzero horizon
	maxHorz uint32 // the latest horizon (serial order): younger entries never expire
}

func (t *slotTable) reset() {
	t.epoch, t.seq, t.n, t.maxGone, t.anyHorz, t.maxHorz = 0, 0, 0, 0, false, 0
	t.active = [maxWords]uint64{}
}

// decodeSlots parses v into t. It reports false (and leaves t empty) when
// v is not a valid slot table.
func decodeSlots(v []byte, t *slotTable) bool {
	t.reset()
	if len(v) < slotsHeader || v[0] != slotsMagic0 || v[1] != slotsMagic1 || v[2] != slotsVersion {
		return false
	}
	n := int(le.Uint16(v[8:]))
	if n > MaxSlots || len(v) != slotsHeader+n*slotRecord {
		return false
	}
	t.epoch = le.Uint32(v[4:])
	t.seq = le.Uint32(v[12:])
	t.n = n
	for i := 0; i < n; i++ {
		r := v[slotsHeader+i*slotRecord:]
		rec := slotRec{
			addrHash:   le.Uint64(r),
			gen:        le.Uint32(r[8:]),
			clearEpoch: le.Uint32(r[12:]),
			capacity:   le.Uint32(r[16:]),
			horizon:    le.Uint32(r[20:]),
		}
		if rec.clearEpoch > t.epoch {
			t.reset()
			return false
		}
		t.recs[i] = rec
		if rec.addrHash != 0 {
			t.active[i/64] |= 1 << (i % 64)
			if rec.horizon != 0 {
				if !t.anyHorz || int32(rec.horizon-t.maxHorz) > 0 {
					t.maxHorz = rec.horizon
				}
				t.anyHorz = true
			}
		}
		if rec.clearEpoch > t.maxGone {
			t.maxGone = rec.clearEpoch
		}
	}
	return true
}

func encodeSlots(dst []byte, t *slotTable) []byte {
	dst = append(dst[:0], slotsMagic0, slotsMagic1, slotsVersion, 0)
	dst = le.AppendUint32(dst, t.epoch)
	dst = le.AppendUint16(dst, uint16(t.n))
	dst = append(dst, 0, 0)
	dst = le.AppendUint32(dst, t.seq)
	for i := 0; i < t.n; i++ {
		r := &t.recs[i]
		dst = le.AppendUint64(dst, r.addrHash)
		dst = le.AppendUint32(dst, r.gen)
		dst = le.AppendUint32(dst, r.clearEpoch)
		dst = le.AppendUint32(dst, r.capacity)
		dst = le.AppendUint32(dst, r.horizon)
	}
	return dst
}

// parseStamp returns the seq a slot table stamp holds.
func parseStamp(v []byte) (seq uint32, ok bool) {
	if len(v) != stampLen || v[0] != stampMagic0 || v[1] != stampMagic1 || v[2] != formatVersion {
		return 0, false
	}
	return le.Uint32(v[4:]), true
}

func encodeStamp(dst []byte, seq uint32) []byte {
	dst = append(dst[:0], stampMagic0, stampMagic1, formatVersion, 0)
	return le.AppendUint32(dst, seq)
}

// words returns the bitmap words needed for the slots in use.
func (t *slotTable) words() int { return (t.n + 63) / 64 }

// staleMask returns the slots whose bits in a shard last written at
// shardEpoch must be ignored: slots removed or cleared after that write.
// This is what makes a removed host's bits stop counting at once, without
// touching the shards.
//
// The epoch test is inlined into presence, run for every probe; the slot loop,
// needed only after a removal or clear the shard has not seen, stays out of
// line (each function entered costs a request: docs/performance.md).
func (t *slotTable) staleMask(shardEpoch uint32) (m [maxWords]uint64) {
	if t.maxGone <= shardEpoch {
		return m
	}
	return t.staleSlots(shardEpoch)
}

// staleSlots is staleMask without its shortcut for shards written after
// the last removal or clear.
//
//go:noinline
func (t *slotTable) staleSlots(shardEpoch uint32) (m [maxWords]uint64) {
	for i := 0; i < t.n; i++ {
		if t.recs[i].clearEpoch > shardEpoch {
			m[i/64] |= 1 << (i % 64)
		}
	}
	return m
}

// dropStale clears from p the slots removed or cleared after shardEpoch,
// for presence, where the test for any such slot stays inline and this
// rare work out of line (hence noinline).
//
//go:noinline
func (t *slotTable) dropStale(p [maxWords]uint64, shardEpoch uint32) [maxWords]uint64 {
	return andNot(p, t.staleSlots(shardEpoch))
}

// shardView is a parsed shard value, read in place.
type shardView struct {
	buf    []byte
	words  int
	n      int
	epoch  uint32
	stride int
}

func parseShard(v []byte) (s shardView, ok bool) {
	ok = s.parse(v)
	return s, ok
}

// parse sets s to the shard value v and reports whether v is one (s is
// then empty). It fills s in place, for presence: returning a view costs
// a copy of it at each call site in Wasm.
func (s *shardView) parse(v []byte) bool {
	var view shardView // one store into s: each costs a write barrier
	ok := len(v) >= shardHeader && v[0] == shardMagic0 && v[1] == shardMagic1 && v[2] == formatVersion
	if ok {
		w := int(v[3])
		n := int(le.Uint16(v[8:]))
		stride := 8 + 8*w
		ok = w <= maxWords && (n == 0 || w > 0) && len(v) == shardHeader+n*stride
		if ok {
			view = shardView{buf: v, words: w, n: n, epoch: le.Uint32(v[4:]), stride: stride}
		}
	}
	*s = view
	return ok
}

// holders returns the bitmap of the entry tagged tag, masked by active,
// and the entry's age; ok is false when no entry has that tag. Entries
// are kept sorted by tag, so this is a binary search (a linear scan of 64
// entries costs microseconds inside Wasm, and Record runs one per block).
// Lookup, bitmap and mask are one function because presence, which every
// probe of a query runs, needs all three: in Wasm each function entered
// costs its own code, and an unmasked bitmap would be one more copy.
func (s *shardView) holders(tag uint32, active *[maxWords]uint64) (p [maxWords]uint64, age uint32, ok bool) {
	// One return: in Wasm each return site copies the bitmap out.
	if i := searchTag(s.buf, s.stride, s.n, tag); i < s.n {
		r := s.buf[shardHeader+i*s.stride:]
		if ok = le.Uint32(r) == tag; ok {
			for w := range p {
				if w == s.words {
					break
				}
				p[w] = le.Uint64(r[8+8*w:]) & active[w]
			}
			age = le.Uint32(r[4:])
		}
	}
	return p, age, ok
}

// sorted reports whether the tags are strictly increasing.
func (s *shardView) sorted() bool {
	if s.n < 2 {
		return true
	}
	prev := le.Uint32(s.buf[shardHeader:])
	for off := shardHeader + s.stride; off+4 <= len(s.buf); off += s.stride {
		tag := le.Uint32(s.buf[off:])
		if tag <= prev {
			return false
		}
		prev = tag
	}
	return true
}

// searchTag returns the first entry whose tag is not below tag.
func searchTag(buf []byte, stride, n int, tag uint32) int {
	lo, hi := 0, n
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if le.Uint32(buf[shardHeader+mid*stride:]) < tag {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

func (s *shardView) age(i int) uint32 { return le.Uint32(s.buf[shardHeader+i*s.stride+4:]) }

func (s *shardView) bitmap(i int) (m [maxWords]uint64) {
	off := shardHeader + i*s.stride + 8
	for w := 0; w < s.words; w++ {
		m[w] = le.Uint64(s.buf[off+8*w:])
	}
	return m
}

// blockTag is what an entry stores to recognise its block: the low 28
// bits of the block hash (the shard index comes from the high bits via
// Fibonacci hashing) and the block's resolution level in the top 4 bits,
// so eviction can weigh coarse blocks by the tokens they cover.
func blockTag(h uint64, level int) uint32 {
	return uint32(h)&0x0FFFFFFF | uint32(level)<<28
}

func tagLevel(tag uint32) int { return int(tag >> 28) }

// shardOf maps a hash to a shard by Fibonacci hashing.
func shardOf(h uint64, shardBits uint) int {
	return int((h * 0x9E3779B97F4A7C15) >> (64 - shardBits))
}

func andNot(a, b [maxWords]uint64) (m [maxWords]uint64) {
	for i := range a {
		m[i] = a[i] &^ b[i]
	}
	return m
}

func and(a, b [maxWords]uint64) (m [maxWords]uint64) {
	for i := range a {
		m[i] = a[i] & b[i]
	}
	return m
}

func isZero(a [maxWords]uint64) bool {
	return a[0]|a[1]|a[2]|a[3] == 0
}

func trailingZeros(x uint64) int { return bits.TrailingZeros64(x) }
