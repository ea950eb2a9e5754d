package index

// Matches is the answer of one Query, indexed by host slot.
type Matches struct {
	// Blocks[s] is the matched prefix length, in blocks, of slot s (see
	// Query for the exact guarantee); 0 for free slots. Its length is the
	// slot table's size at query time.
	Blocks []int
	// Reads and BytesRead are the shared-data gets this query made and the
	// bytes they copied (slot table included).
	Reads, BytesRead int

	ages   [MaxSlots]uint32 // age of the entry of block Blocks[s]-1
	chain  uint64           // first block hash of the chain queried
	length int
	table  uint32 // slot table epoch at query time
	query  uint64 // Metrics.Queries of the Query that filled it
}

// Best returns the slot with the longest match and its length (-1, 0 when
// no host matches a block).
func (m *Matches) Best() (slot, blocks int) {
	slot = -1
	for s, n := range m.Blocks {
		if n > blocks {
			slot, blocks = s, n
		}
	}
	return slot, blocks
}

type queryState struct {
	blocks    []uint64
	hint      *hintLine // the answers of the last query with this first block
	found     [hintsPerLine]int32
	nfound    int
	m         *Matches
	budget    int
	truncated bool
	now       uint32
	reads     []shardRead // the shards this query read, in read order
	// cacheBuf[k] is the buffer shard read k of a query is copied into
	// (AppendGetter); kept across queries, so warm queries allocate
	// nothing. reads[k].view views it until Record takes it (queriedShard).
	cacheBuf [][]byte
	reusable bool // the shards read may seed the Record of the same Matches
}

// shardRead is one shard read by a query. One record per read (rather
// than a slice per field) keeps presence, run for every probe, to one
// append and one lookup loop.
type shardRead struct {
	shard int // -1 once forgotten (forgetShard)
	view  shardView
	valid bool   // view parsed: the shard was found and not corrupt
	got   bool   // the shard was found
	cas   uint32 // CAS to write it back with; 0 with !got: missing
}

// Query fills m with each host's longest matched prefix of the chain
// blocks (as from Hasher.Blocks).
//
// It runs one binary search for all hosts at once: probing block mid
// splits the hosts into those holding it (whose answer is above mid) and
// those not (below), so it makes at most K*log2(N) probes for K distinct
// answers, each probe at most one shard read, and reads each block at
// most once. It probes guessed boundaries first (the chain's end, the
// VM's last answers for chains with this first block or, on the VM's
// first query of a prefix, the lengths Records published in the shared
// hint line; see Hints and sharedhints.go), which
// settles most answers with one shard read each; the guesses change
// which blocks are read, not what an answer may be.
//
// Presence is only approximately prefix-closed: an eviction or a removal
// event can drop a block in the middle of a held chain. Then the answer
// for a host is a boundary L of its presence: block L-1 is held (or L=0)
// and block L is not (or L=N). When presence is prefix-closed, L is
// exactly the longest held prefix; in general L is at least the first
// missing block (the engine's own prefix hit stops there), i.e. Query may
// over-report a host with a hole, never under-report one without.
func (ix *Index) Query(blocks []uint64, m *Matches) error {
	ix.metrics.Queries++
	reads0, bytes0 := ix.metrics.Reads, ix.metrics.BytesRead
	ix.refreshSlots()
	t := &ix.table
	if cap(m.Blocks) < t.n {
		m.grow()
	}
	m.Blocks = m.Blocks[:t.n]
	clear(m.Blocks)
	m.length = len(blocks)
	m.chain = 0
	if len(blocks) > 0 {
		m.chain = blocks[0]
	}
	m.table = t.epoch
	q := &ix.q
	q.blocks = blocks
	q.m = m
	q.budget = ix.cfg.MaxQueryReads
	q.truncated = false
	q.now = ix.nowAge()
	q.reads = q.reads[:0]
	q.reusable = true
	m.query = ix.metrics.Queries
	q.hint = nil
	if len(blocks) > 0 && !isZero(t.active) {
		// Most hosts hold not even the first block: settle them with one
		// probe, then search the rest over [1, N].
		p, age, ok := ix.presence(0)
		if ok {
			held := and(t.active, p)
			if !isZero(held) {
				ix.setAge(held, age)
				if !ix.cfg.NoQueryHints {
					q.hint = &ix.hints[blocks[0]%hintLines]
					if q.hint.first != blocks[0] {
						ix.assignHint(q.hint, blocks)
					}
				}
				q.nfound = 0
				ix.search(1, len(blocks), held)
				if q.hint != nil {
					q.hint.remember(q.found[:q.nfound], blocks)
				}
			}
		}
	}
	if q.truncated {
		ix.metrics.Truncated++
	}
	m.Reads = int(ix.metrics.Reads - reads0)
	m.BytesRead = int(ix.metrics.BytesRead - bytes0)
	q.blocks, q.m = nil, nil
	return nil
}

// grow gives m.Blocks room for every slot, on a Matches' first Query. It is
// out of line (hence noinline) because each function entered costs a request
// (docs/performance.md): Query's hot path stays small.
//
//go:noinline
func (m *Matches) grow() {
	m.Blocks = make([]int, 0, MaxSlots)
}

// assignHint gives the VM's hint line h to chain, on the first query of
// a chain whose first block h did not hold: empty, then seeded from the
// shared line. Out of line (hence noinline) for the reason of grow.
//
//go:noinline
func (ix *Index) assignHint(h *hintLine, chain []uint64) {
	h.first, h.n = chain[0], 0
	if ix.useSharedHints(len(chain)) {
		ix.loadSharedHints(h, chain)
	}
}

// search settles the hosts in set, all holding block lo-1, whose answer
// lies in [lo, hi].
func (ix *Index) search(lo, hi int, set [maxWords]uint64) {
	for !isZero(set) {
		if lo < hi {
			mid := ix.probeAt(lo, hi)
			p, age, ok := ix.presence(mid)
			if ok {
				above := and(set, p)
				ix.setAge(above, age)
				ix.search(mid+1, hi, above)
				set = andNot(set, p)
				hi = mid
				continue
			}
			// Out of read budget: keep what is proven.
		}
		ix.assign(set, lo) // one call site: each copies the set in Wasm
		return
	}
}

// Hints.
//
// A binary search finds the same answers whatever block it probes in
// [lo, hi): probing block q splits the hosts into those holding it
// (answer above q) and those not (answer at most q). Midpoints bound the
// probes to K*log2(N); good guesses need about one shard read per
// distinct answer, since a boundary L (block L-1 held, block L not)
// usually lies inside one segment. Two sources of guesses, both only
// deciding the order of probes, never an answer:
//
//   - the chain's end (N-1): a repeated prompt, held whole by the host
//     that served it, is settled by one probe of its last segment;
//   - the distinct answers of the last query this VM ran for a chain with
//     the same first block (a system prompt's length, the previous turn
//     of a conversation), each used only if this chain has the same
//     block L-1 (the same prefix up to the guess): a per-VM table of
//     hintLines lines, seeded from the shared hint line (the chain
//     lengths any VM's Record published) when a line is assigned to a
//     new first block. Guesses from unrelated chains would stop the
//     search at holes (blocks evicted from the middle of a chain) near
//     their answers: the drift replay under-reported more.
//
// Probes at guesses are chosen nearest to the midpoint, and each block
// is still probed at most once, so wrong guesses cost at most
// 2*hintsPerLine extra probes.

const (
	hintLines    = 64
	hintsPerLine = 8
)

// hintLine holds the distinct answers (above 0) of the last query of a
// chain starting with block first.
type hintLine struct {
	first uint64
	n     int
	at    [hintsPerLine]int32
	last  [hintsPerLine]uint64 // hash of block at[k]-1 of that chain
}

// remember replaces the line's answers with found (distinct answers
// between 1 and N-1 of the query of chain, at most hintsPerLine).
func (h *hintLine) remember(found []int32, chain []uint64) {
	for k, L := range found {
		h.at[k], h.last[k] = L, chain[L-1]
	}
	h.n = len(found)
}

// probeAt picks the block to probe for hosts whose answer lies in
// [lo, hi] (lo < hi): the guessed boundary nearest to the midpoint
// (block L-1, then block L, of a guess L), else the midpoint.
func (ix *Index) probeAt(lo, hi int) int {
	mid := int(uint(lo+hi) >> 1)
	best, bestDist := mid, -1
	try := func(L int) {
		q := L - 1
		if q < lo {
			q = L
		}
		if q < lo || q >= hi {
			return
		}
		d := q - mid
		if d < 0 {
			d = -d
		}
		if bestDist < 0 || d < bestDist {
			best, bestDist = q, d
		}
	}
	blocks := ix.q.blocks
	try(len(blocks))
	if h := ix.q.hint; h != nil {
		for k := 0; k < h.n; k++ {
			// Only where the earlier chain had this prefix: elsewhere its
			// answers say nothing about this chain.
			if L := int(h.at[k]); L <= len(blocks) && blocks[L-1] == h.last[k] {
				try(L)
			}
		}
	}
	return best
}

func (ix *Index) assign(set [maxWords]uint64, n int) {
	q := &ix.q
	if q.hint != nil && n > 0 && n < len(q.blocks) && q.nfound < hintsPerLine && !isZero(set) {
		// Answers are assigned once per distinct (hosts, n): keep the
		// distinct ones for the next query's guesses.
		dup := false
		for _, f := range q.found[:q.nfound] {
			dup = dup || f == int32(n)
		}
		if !dup {
			q.found[q.nfound] = int32(n)
			q.nfound++
		}
	}
	b := ix.q.m.Blocks
	for w, word := range set {
		for word != 0 {
			s := w*64 + trailingZeros(word)
			word &= word - 1
			if s < len(b) {
				b[s] = n
			}
		}
	}
}

func (ix *Index) setAge(set [maxWords]uint64, age uint32) {
	for w, word := range set {
		for word != 0 {
			s := w*64 + trailingZeros(word)
			word &= word - 1
			ix.q.m.ages[s] = age
		}
	}
}

// presence returns the hosts that hold block i (valid bits only) and the
// entry's age; ok is false when the read budget is spent.
func (ix *Index) presence(i int) (p [maxWords]uint64, age uint32, ok bool) {
	q := &ix.q
	sh := ix.shardAt(q.blocks, i)
	var rd *shardRead
	for k := range q.reads {
		if q.reads[k].shard == sh {
			rd = &q.reads[k]
			break
		}
	}
	if rd == nil && q.budget > 0 {
		q.budget--
		k := len(q.reads)
		if k == len(q.cacheBuf) || k == cap(q.reads) {
			q.addRead()
		}
		v, cas, got := ix.getInto(&q.cacheBuf[k], ix.shardKeys[sh])
		q.reads = q.reads[:k+1]
		rd = &q.reads[k]
		rd.shard, rd.got, rd.cas = sh, got, cas
		// A missing key's empty value does not parse either: the view is
		// then empty, and only a found value is counted corrupt.
		rd.valid = rd.view.parse(v)
		if got && !rd.valid {
			ix.metrics.Corrupt++
		}
	}
	// One return: in Wasm each return site copies the bitmap out.
	ok = rd != nil
	if !ok {
		q.truncated = true // out of read budget
	} else if rd.valid {
		t := &ix.table
		var found bool
		p, age, found = rd.view.holders(blockTag(q.blocks[i], ix.level(i)), &t.active)
		if found {
			if t.maxGone > rd.view.epoch { // rare: see staleMask
				p = t.dropStale(p, rd.view.epoch)
			}
			if t.anyHorz {
				p = t.dropExpired(p, age)
			}
		}
	}
	return p, age, ok
}

// addRead makes room for one more shard read per query: a buffer in cacheBuf
// and a record in reads. It runs only while the VM meets queries reading more
// shards than any before, so it is out of presence (hence noinline): each
// function entered costs a request (docs/performance.md).
//
//go:noinline
func (q *queryState) addRead() {
	k := len(q.reads)
	if k == len(q.cacheBuf) {
		q.cacheBuf = append(q.cacheBuf, nil)
	}
	if k == cap(q.reads) {
		q.reads = append(q.reads, shardRead{})[:k]
	}
}

// queriedShard returns the value and CAS of shard sh as the last Query
// read it, if that Query filled m and m is what Record got: a Record right
// after its Query then skips the get of the shards the search already
// copied (the CAS rejects the write if the shard changed since).
//
// The caller may edit the value in place (updateShard does); it must then
// call forgetShard, so that a second segment of the same Record in that
// shard reads it again instead of taking an edited copy.
func (ix *Index) queriedShard(sh int) (v []byte, cas uint32, found, ok bool) {
	q := &ix.q
	if !q.reusable {
		return nil, 0, false, false
	}
	for k := range q.reads {
		rd := &q.reads[k]
		if rd.shard != sh {
			continue
		}
		if rd.got && !rd.valid {
			return nil, 0, false, false // corrupt: read it again
		}
		return rd.view.buf, rd.cas, rd.got, true
	}
	return nil, 0, false, false
}

// forgetShard drops shard sh from the shards the last Query read.
func (ix *Index) forgetShard(sh int) {
	for k := range ix.q.reads {
		if ix.q.reads[k].shard == sh {
			ix.q.reads[k].shard = -1
		}
	}
}

// dropExpired clears the hosts whose eviction horizon passed age.
func (t *slotTable) dropExpired(p [maxWords]uint64, age uint32) [maxWords]uint64 {
	if !t.anyHorz || int32(age-t.maxHorz) >= 0 {
		return p
	}
	for w := range p {
		if p[w] != 0 {
			p[w] = t.dropExpiredWord(w, p[w], age)
		}
	}
	return p
}

// dropExpiredWord is dropExpired for word w of a bitmap (slots w*64 on),
// without its shortcut for ages at or after the latest horizon.
func (t *slotTable) dropExpiredWord(w int, x uint64, age uint32) uint64 {
	for word := x; word != 0; word &= word - 1 {
		b := trailingZeros(word)
		s := w*64 + b
		if s >= t.n {
			break // the bits left are higher slots still
		}
		if hz := t.recs[s].horizon; hz != 0 && int32(age-hz) < 0 {
			x &^= 1 << b
		}
	}
	return x
}
