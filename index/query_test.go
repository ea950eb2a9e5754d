package index

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// refModel is the brute-force reference: per address, the set of blocks
// held, with no capacity limit.
type refModel struct {
	held map[string]map[uint64]bool
}

func (r *refModel) host(addr string) map[uint64]bool {
	if r.held[addr] == nil {
		r.held[addr] = map[uint64]bool{}
	}
	return r.held[addr]
}

// checkMatch asserts Query's contract for one host against the reference
// presence of the chain's blocks.
func checkMatch(t *testing.T, what string, got int, present []bool) {
	t.Helper()
	n := len(present)
	firstMiss, count := n, 0
	for i, p := range present {
		if p {
			count++
		} else if firstMiss == n {
			firstMiss = i
		}
	}
	if got < 0 || got > n {
		t.Fatalf("%s: match %d outside [0,%d]", what, got, n)
	}
	if got > 0 && !present[got-1] {
		t.Fatalf("%s: match %d but block %d is not held (presence %v)", what, got, got-1, present)
	}
	if got < n && present[got] {
		t.Fatalf("%s: match %d but block %d is held: not a boundary (presence %v)", what, got, got, present)
	}
	if got < firstMiss {
		t.Fatalf("%s: match %d below the first missing block %d", what, got, firstMiss)
	}
	if count == firstMiss && got != firstMiss { // prefix-closed: exact
		t.Fatalf("%s: prefix-closed presence of %d blocks, match %d", what, firstMiss, got)
	}
}

func TestQueryMatchesBruteForceOnRandomWorkloads(t *testing.T) {
	for seed := uint64(1); seed <= 12; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { randomWorkload(t, seed) })
	}
}

func randomWorkload(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 99))
	st := &MemStore{}
	clk := &fakeClock{ms: 5_000_000}
	// Many entries per shard so that nothing overflows: the reference
	// has no capacity limit.
	ix := newTestIndex(t, st, clk, Config{Shards: 64, ShardEntries: 1024, Hash: HashConfig{LevelBlocks: 8}})
	model := &refModel{held: map[string]map[uint64]bool{}}
	refHost := model.host
	// Chains share a system prefix, like real traffic.
	system := chain(seed*1000, 12)
	var chains [][]uint64
	for k := 0; k < 10; k++ {
		c := append([]uint64(nil), system[:rng.IntN(len(system))]...)
		c = append(c, chain(seed*1000+uint64(k)+1, 20+rng.IntN(180))...)
		chains = append(chains, c)
	}
	nHosts := 3 + rng.IntN(70)
	addrs := make([]string, nHosts)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.%d.0.%d:8000", seed, i)
		if _, err := ix.Register(addrs[i]); err != nil {
			t.Fatal(err)
		}
	}
	var m Matches
	for op := 0; op < 600; op++ {
		clk.ms += int64(rng.IntN(3000))
		addr := addrs[rng.IntN(nHosts)]
		c := chains[rng.IntN(len(chains))]
		switch r := rng.IntN(100); {
		case r < 45:
			hr, ok := ix.Lookup(addr)
			if !ok {
				t.Fatalf("lookup %s failed", addr)
			}
			n := rng.IntN(len(c) + 1)
			if err := ix.Record(hr, c[:n], nil); err != nil {
				t.Fatal(err)
			}
			for _, b := range c[:n] {
				refHost(addr)[b] = true
			}
		case r < 55: // a removal event punches a hole
			hr, _ := ix.Lookup(addr)
			i := rng.IntN(len(c))
			j := i + 1 + rng.IntN(3)
			if j > len(c) {
				j = len(c)
			}
			if err := ix.Removed(hr, c[:j], i); err != nil {
				t.Fatal(err)
			}
			for _, b := range c[i:j] {
				delete(refHost(addr), b)
			}
		case r < 58:
			hr, _ := ix.Lookup(addr)
			if err := ix.Clear(hr); err != nil {
				t.Fatal(err)
			}
			clear(refHost(addr))
		case r < 61: // the host leaves; a new one may take its slot
			if err := ix.Remove(addr); err != nil {
				t.Fatal(err)
			}
			clear(refHost(addr))
			newAddr := fmt.Sprintf("10.%d.1.%d:8000", seed, op)
			for i := range addrs {
				if addrs[i] == addr {
					addrs[i] = newAddr
				}
			}
			if _, err := ix.Register(newAddr); err != nil {
				t.Fatal(err)
			}
		default:
			n := rng.IntN(len(c) + 1)
			q := c[:n]
			if rng.IntN(2) == 0 {
				// A VM's first query of this prefix: its guesses come
				// from the shared hint line (Records of any VM).
				ix.hints = [hintLines]hintLine{}
			}
			if err := ix.Query(q, &m); err != nil {
				t.Fatal(err)
			}
			for _, a := range addrs {
				hr, ok := ix.lookupCached(addrHash(a))
				if !ok {
					t.Fatalf("%s not in the table", a)
				}
				present := make([]bool, n)
				for i, b := range q {
					present[i] = refHost(a)[b]
				}
				checkMatch(t, fmt.Sprintf("op %d host %s", op, a), m.Blocks[hr.Slot], present)
			}
		}
	}
	if mt := ix.Metrics(); mt.Overflows != 0 || mt.Corrupt != 0 || mt.CASFailures != 0 || mt.Truncated != 0 {
		t.Fatalf("unexpected metrics %+v", mt)
	}
}

// Hints change which blocks a query probes, never its answers: a second
// query of the same chain (hints from the first) and a query of another
// chain with the same first block (hints that do not fit) answer exactly
// as a VM without hints, and the warm query reads about one shard per
// distinct answer instead of searching for each.
func TestQueryHintsCutReadsNotAnswers(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	ix := newTestIndex(t, st, clk, Config{Shards: 4096})
	c := chain(21, 192)
	other := append(append([]uint64(nil), c[:40]...), chain(22, 150)...)
	lengths := []int{192, 115, 57, 19, 19, 19, 19, 19}
	for p, n := range lengths {
		ref, err := ix.Register(fmt.Sprintf("10.7.0.%d:80", p))
		if err != nil {
			t.Fatal(err)
		}
		ix.Record(ref, c[:n], nil)
		ix.Record(ref, other[:min(n+30, len(other))], nil)
	}
	answers := func(q *Index, chain []uint64) ([]int, int) {
		var m Matches
		if err := q.Query(chain, &m); err != nil {
			t.Fatal(err)
		}
		return append([]int(nil), m.Blocks...), m.Reads
	}
	for _, ch := range [][]uint64{c, other, c} {
		cold := newTestIndex(t, st, clk, Config{Shards: 4096, NoQueryHints: true})
		want, coldReads := answers(cold, ch)
		got, _ := answers(ix, ch) // hints from the previous chain
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("with hints %v, without %v", got, want)
		}
		// Another VM's first query of this prefix: guesses from the
		// shared hint line only (plus its key read).
		fresh := newTestIndex(t, st, clk, Config{Shards: 4096})
		shared, sharedReads := answers(fresh, ch)
		if fmt.Sprint(shared) != fmt.Sprint(want) {
			t.Fatalf("with shared hints %v, without %v", shared, want)
		}
		again, warmReads := answers(ix, ch)
		if fmt.Sprint(again) != fmt.Sprint(want) {
			t.Fatalf("warm %v, want %v", again, want)
		}
		// Table (or stamp) + block 0's shard + at most two shards per
		// other answer (a boundary on a segment edge spans two).
		distinct := map[int]bool{}
		for _, b := range want {
			if b > 1 {
				distinct[b] = true
			}
		}
		if warmReads > 2+2*len(distinct) || warmReads >= coldReads {
			t.Fatalf("warm query made %d reads, cold %d: hints did not cut the search", warmReads, coldReads)
		}
		if sharedReads > 3+2*len(distinct) || sharedReads >= coldReads {
			t.Fatalf("first query with shared hints made %d reads, cold %d: they did not cut the search", sharedReads, coldReads)
		}
	}
}

// Shared hints that lie (lengths that are not boundaries, hashes of other
// chains, lengths past the chain) or are corrupt change reads, never
// answers, and a corrupt line is counted and replaced by the next Record.
func TestSharedHintsNeverChangeAnswers(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	ix := newTestIndex(t, st, clk, Config{Shards: 4096})
	c := chain(41, 192)
	for p, n := range []int{192, 115, 57, 19, 19} {
		ref, err := ix.Register(fmt.Sprintf("10.8.0.%d:80", p))
		if err != nil {
			t.Fatal(err)
		}
		ix.Record(ref, c[:n], nil)
	}
	var want Matches
	ref := newTestIndex(t, st, clk, Config{Shards: 4096, NoQueryHints: true})
	if err := ref.Query(c, &want); err != nil {
		t.Fatal(err)
	}
	key := ix.sharedHintKey(c[0])
	lies := sharedLine{first: c[0]}
	for _, L := range []int32{3, 64, 100, 150, 191} { // right hashes, wrong lengths
		lies.push(L, c[L-1])
	}
	lies.push(57, 12345) // a right length with another chain's hash
	lies.push(500, 7)    // past the chain
	values := [][]byte{
		encodeHints(nil, &lies),
		{'K', 'H', formatVersion, 9},       // short
		append(encodeHints(nil, &lies), 0), // wrong length
		{'K', 'H', formatVersion, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}, // length 0
	}
	for k, v := range values {
		if err := st.Set(key, v, 0); err != nil {
			t.Fatal(err)
		}
		vm := newTestIndex(t, st, clk, Config{Shards: 4096})
		var m Matches
		if err := vm.Query(c, &m); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(m.Blocks) != fmt.Sprint(want.Blocks) {
			t.Fatalf("value %d: shared hints changed the answers: %v, want %v", k, m.Blocks, want.Blocks)
		}
		if corrupt := vm.Metrics().Corrupt; (k > 0) != (corrupt == 1) {
			t.Fatalf("value %d: %d corrupt values counted", k, corrupt)
		}
		// The next Record of the chain replaces a corrupt line.
		a, _ := vm.Lookup("10.8.0.0:80")
		if err := vm.Record(a, c[:150], nil); err != nil {
			t.Fatal(err)
		}
		got, _, err := st.Get(key)
		var l sharedLine
		if err != nil || !parseHints(got, &l) || l.first != c[0] || !l.has(150, c[149]) {
			t.Fatalf("value %d: the Record did not publish its length: %v %+v", k, err, l)
		}
	}
}

// Record publishes a chain's length only when the shared line lacks it:
// a repeated Record of the same length writes no hint, and the line keeps
// at most hintsPerLine lengths, the most recent first.
func TestSharedHintsWriteOnlyChanges(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	ix := newTestIndex(t, st, clk, Config{Shards: 4096})
	a, _ := ix.Register("10.9.0.1:80")
	c := chain(51, 192)
	ix.Record(a, c[:100], nil)
	key := ix.sharedHintKey(c[0])
	_, cas0, err := st.Get(key)
	if err != nil {
		t.Fatalf("no shared hint after a Record: %v", err)
	}
	clk.ms += 5000 // past TouchAfterMs: the shards are rewritten
	ix.Record(a, c[:100], nil)
	other := newTestIndex(t, st, clk, Config{Shards: 4096})
	other.Record(a, c[:100], nil) // another VM reads the line, finds it there
	if _, cas, _ := st.Get(key); cas != cas0 {
		t.Fatal("recording the same length again rewrote the shared hint")
	}
	for n := 20; n <= 190; n += 10 {
		other.Record(a, c[:n], nil)
	}
	v, _, _ := st.Get(key)
	var l sharedLine
	if !parseHints(v, &l) || l.n != hintsPerLine || l.at[0] != 190 || l.at[hintsPerLine-1] != 120 {
		t.Fatalf("line %+v, want the %d most recent lengths 190..120", l, hintsPerLine)
	}
	if len(v) != hintsHeader+hintsPerLine*hintsRecord {
		t.Fatalf("line of %d bytes", len(v))
	}
}

// A Record right after its Query writes the shards the search already
// copied without reading them again; the CAS still guards them.
func TestRecordReusesQueriedShards(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	ix := newTestIndex(t, st, clk, Config{Shards: 4096})
	a, _ := ix.Register("10.6.0.1:80")
	b, _ := ix.Register("10.6.0.2:80")
	c := chain(31, 16) // two segments
	if ix.shardAt(c, 0) == ix.shardAt(c, 8) {
		t.Skip("both segments in one shard")
	}
	ix.Record(b, c[:3], nil)
	var m Matches
	ix.Query(c, &m)
	if m.Blocks[b.Slot] != 3 || m.Reads != 3 { // stamp, segment 0, the chain's end
		t.Fatalf("query: b at %d, %d reads", m.Blocks[b.Slot], m.Reads)
	}
	r0 := ix.Metrics().Reads
	if err := ix.Record(a, c, &m); err != nil {
		t.Fatal(err)
	}
	if got := ix.Metrics().Reads - r0; got != 1 { // usage
		t.Fatalf("Record after Query read %d values, want 1 (both segments came from the Query)", got)
	}
	// Another writer changes segment 0 between a Query and its Record:
	// the CAS rejects the stale copy, and nothing is lost.
	other := newTestIndex(t, st, clk, Config{Shards: 4096})
	c2 := append(append([]uint64(nil), c[:4]...), chain(32, 12)...)
	ix.Query(c2, &m)
	other.Record(b, c2[:6], nil)
	if err := ix.Record(a, c2, &m); err != nil {
		t.Fatal(err)
	}
	ix.Query(c2, &m)
	if m.Blocks[a.Slot] != 16 || m.Blocks[b.Slot] != 6 {
		t.Fatalf("after a concurrent write: a at %d (want 16), b at %d (want 6)", m.Blocks[a.Slot], m.Blocks[b.Slot])
	}
	if ix.Metrics().CASRetries == 0 {
		t.Fatal("the stale copy of segment 0 was not rejected")
	}
}
