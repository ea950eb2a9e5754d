package index

import "strconv"

// Shared hints.
//
// The per-VM hints (see Hints in query.go) make a query warm only in the
// VM that already queried a chain with the same first block; Envoy runs
// one VM per worker thread, so the first query of a conversation's next
// turn usually lands on a VM that never saw it and pays a full binary
// search (about log2(N/8) shard reads per distinct answer). Record
// therefore also publishes the chain lengths it writes in a small shared
// value keyed by the chain's first block, and a query whose VM has no
// hints for that first block reads it once and probes those boundaries
// first. Like the per-VM hints they only order the probes: each guess L
// is used only where the queried chain has the same block L-1 as the
// recorded chain, and a wrong or corrupt guess costs probes, never an
// answer.
//
// The value holds hashes only (the first block, and block L-1 of each
// recorded length), never prompt text. There are sharedHintKeys keys,
// chosen by the first block; chains that collide replace each other's
// line (the latest recorded wins), which bounds the shared memory at
// about sharedHintKeys x 108 bytes.

const (
	sharedHintKeys = 1024

	hintsMagic0, hintsMagic1 = 'K', 'H'
	hintsHeader              = 12 // magic(2) version(1) n(1) first(8)
	hintsRecord              = 12 // length(4) hash of block length-1 (8)

	// sharedHintMinSegments: chains of at most this many segments are
	// searched in at most as many shard reads as a hint would cost (the
	// key read plus the probes), so they neither read nor publish hints.
	sharedHintMinSegments = 2
)

// sharedLine is a decoded shared hint value, or this VM's last knowledge
// of one.
type sharedLine struct {
	first uint64
	n     int
	at    [hintsPerLine]int32
	last  [hintsPerLine]uint64
}

func (l *sharedLine) has(L int32, last uint64) bool {
	for k := 0; k < l.n; k++ {
		if l.at[k] == L && l.last[k] == last {
			return true
		}
	}
	return false
}

// push makes (L, last) the most recent guess, dropping the oldest past
// hintsPerLine and any older copy of L.
func (l *sharedLine) push(L int32, last uint64) {
	n := 0
	var at [hintsPerLine]int32
	var lst [hintsPerLine]uint64
	at[0], lst[0] = L, last
	n = 1
	for k := 0; k < l.n && n < hintsPerLine; k++ {
		if l.at[k] == L {
			continue
		}
		at[n], lst[n] = l.at[k], l.last[k]
		n++
	}
	l.n, l.at, l.last = n, at, lst
}

// parseHints decodes a shared hint value; ok is false for anything the
// index did not write (short, other magic or version, wrong length, a
// length of 0).
func parseHints(v []byte, l *sharedLine) bool {
	*l = sharedLine{}
	if len(v) < hintsHeader || v[0] != hintsMagic0 || v[1] != hintsMagic1 || v[2] != formatVersion {
		return false
	}
	n := int(v[3])
	if n > hintsPerLine || len(v) != hintsHeader+n*hintsRecord {
		return false
	}
	l.first = le.Uint64(v[4:])
	for k := 0; k < n; k++ {
		r := v[hintsHeader+k*hintsRecord:]
		L := le.Uint32(r)
		if L == 0 || L > 1<<30 {
			*l = sharedLine{}
			return false
		}
		l.at[k], l.last[k] = int32(L), le.Uint64(r[4:])
	}
	l.n = n
	return true
}

func encodeHints(dst []byte, l *sharedLine) []byte {
	dst = append(dst[:0], hintsMagic0, hintsMagic1, formatVersion, byte(l.n))
	dst = le.AppendUint64(dst, l.first)
	for k := 0; k < l.n; k++ {
		dst = le.AppendUint32(dst, uint32(l.at[k]))
		dst = le.AppendUint64(dst, l.last[k])
	}
	return dst
}

// sharedHintKey returns the key of the shared hint line of a chain whose
// first block is first.
func (ix *Index) sharedHintKey(first uint64) string {
	if ix.hintKeys == nil {
		ix.hintKeys = make([]string, sharedHintKeys)
	}
	i := int(first % sharedHintKeys)
	if ix.hintKeys[i] == "" {
		ix.hintKeys[i] = ix.cfg.Namespace + "/h/" + strconv.FormatUint(uint64(i), 36)
	}
	return ix.hintKeys[i]
}

// useSharedHints reports whether a chain of n blocks reads and publishes
// shared hints.
func (ix *Index) useSharedHints(n int) bool {
	return !ix.cfg.NoQueryHints && !ix.cfg.NoSharedHints && n > sharedHintMinSegments*ix.cfg.SegmentBlocks
}

// sharedState is this VM's last knowledge of one shared hint line.
type sharedState struct {
	key   string
	line  sharedLine // what key held when this VM last read or wrote it
	known bool       // line is meaningful
	cas   uint32     // CAS of that read; 0: the key was missing
	casOK bool       // cas may still be current (false after our own set)
}

// readShared copies key into ix.shared, counting a corrupt value.
func (ix *Index) readShared(key string) {
	sh := &ix.shared
	v, cas, found := ix.getInto(&ix.stampBuf, key) // parsed below, not kept
	sh.key, sh.known, sh.cas, sh.casOK = key, true, cas, true
	if !found {
		sh.cas, sh.line = 0, sharedLine{}
		return
	}
	if !parseHints(v, &sh.line) {
		ix.metrics.Corrupt++ // replaced by the next publishHint
	}
}

// loadSharedHints fills the VM's hint line h (just assigned to chain)
// from the shared line of chain's first block.
func (ix *Index) loadSharedHints(h *hintLine, chain []uint64) {
	ix.readShared(ix.sharedHintKey(chain[0]))
	l := &ix.shared.line
	if l.first != chain[0] {
		return // missing, corrupt, or another chain's line (same key)
	}
	h.n = copy(h.at[:], l.at[:l.n])
	copy(h.last[:], l.last[:l.n])
}

// publishHint adds the length of chain (just recorded) to its shared
// hint line unless the line already holds it: nothing when this VM last
// saw it there, else a get (skipped when the Query just read the line)
// and one CAS set, retried on a concurrent change.
func (ix *Index) publishHint(chain []uint64) {
	L, last := int32(len(chain)), chain[len(chain)-1]
	key := ix.sharedHintKey(chain[0])
	sh := &ix.shared
	if sh.known && sh.key == key && sh.line.first == chain[0] && sh.line.has(L, last) {
		return
	}
	for attempt := 0; attempt < ix.cfg.CASRetries; attempt++ {
		if attempt > 0 || !sh.known || !sh.casOK || sh.key != key {
			ix.readShared(key)
		}
		if sh.line.first != chain[0] {
			sh.line = sharedLine{first: chain[0]}
		} else if sh.line.has(L, last) {
			return
		}
		sh.line.push(L, last)
		ix.enc = encodeHints(ix.enc, &sh.line)
		retry, err := ix.set(key, ix.enc, sh.cas)
		sh.casOK = false
		if err == nil {
			return // sh.line is what the key holds now
		}
		sh.known = false
		if !retry {
			return
		}
	}
	ix.metrics.CASFailures++
}
