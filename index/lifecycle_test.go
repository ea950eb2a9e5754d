package index

import (
	"errors"
	"fmt"
	"testing"
)

func TestQueryNotPrefixClosed(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	ix := newTestIndex(t, st, clk, Config{Hash: HashConfig{LevelBlocks: -1}})
	a, _ := ix.Register("a:1")
	c := chain(7, 64)
	if err := ix.Record(a, c[:40], nil); err != nil {
		t.Fatal(err)
	}
	// The engine evicted blocks 10..12 in the middle of the held chain.
	if err := ix.Removed(a, c[:13], 10); err != nil {
		t.Fatal(err)
	}
	var m Matches
	ix.Query(c, &m)
	// Probes: 0 (held), then mid of [1,64] = 32 (held), 48 (no), 40 (no),
	// 36, 38, 39 (held): the search lands on the boundary at 40, past the
	// hole. This is the documented answer: a boundary at or above the
	// first missing block.
	if got := m.Blocks[a.Slot]; got != 40 {
		t.Fatalf("match %d, want the boundary 40", got)
	}
	// A query that ends inside the hole's left part sees the hole.
	ix.Query(c[:12], &m)
	if got := m.Blocks[a.Slot]; got != 10 {
		t.Fatalf("short query: match %d, want 10", got)
	}
	// Recording the chain again fills the hole; the answer becomes exact.
	if err := ix.Record(a, c[:40], nil); err != nil {
		t.Fatal(err)
	}
	ix.Query(c[:12], &m)
	if got := m.Blocks[a.Slot]; got != 12 {
		t.Fatalf("after refill: match %d, want 12", got)
	}
}

func TestSlotReuseForgetsThePreviousHost(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	ix := newTestIndex(t, st, clk, Config{})
	other := newTestIndex(t, st, clk, Config{}) // another worker's VM
	a, _ := ix.Register("10.0.0.1:80")
	b, _ := ix.Register("10.0.0.2:80")
	c := chain(3, 50)
	ix.Record(a, c, nil)
	ix.Record(b, c[:20], nil)
	loadA, err := ix.AddLoad(a, 1000, 50)
	if err != nil {
		t.Fatal(err)
	}
	var m Matches
	other.Query(c, &m)
	if m.Blocks[a.Slot] != 50 {
		t.Fatalf("before removal: %v", m.Blocks)
	}
	if err := ix.Remove("10.0.0.1:80"); err != nil {
		t.Fatal(err)
	}
	// Every reader stops counting the removed host's bits at once.
	other.Query(c, &m)
	if m.Blocks[a.Slot] != 0 || m.Blocks[b.Slot] != 20 {
		t.Fatalf("after removal: %v, want a=0 b=20", m.Blocks)
	}
	if _, ok := other.Lookup("10.0.0.1:80"); ok {
		t.Fatal("removed host still found")
	}
	// A new host takes the free slot with a new generation and no blocks.
	n, _ := other.Register("10.0.0.3:80")
	if n.Slot != a.Slot || n.Gen == a.Gen {
		t.Fatalf("new host got %+v, old was %+v; want the same slot, another generation", n, a)
	}
	ix.Query(c, &m)
	if m.Blocks[n.Slot] != 0 {
		t.Fatalf("new host inherited %d blocks", m.Blocks[n.Slot])
	}
	// The stale reference cannot write into the new host's state.
	if err := ix.Record(a, c, nil); !errors.Is(err, ErrStaleHost) {
		t.Fatalf("Record with a stale ref: %v, want ErrStaleHost", err)
	}
	// Load: the new host starts at zero; releasing the old ticket does not
	// touch it.
	loadN, _ := ix.AddLoad(n, 10, 5)
	if err := ix.Release(&loadA); err != nil {
		t.Fatal(err)
	}
	loads := ix.Loads(nil)
	if got := loads[n.Slot]; got != (Load{InFlight: 1, PrefillTokens: 10, DecodeTokens: 5}) {
		t.Fatalf("new host load %+v", got)
	}
	ix.Release(&loadN)
	// Writes after the new host's records keep it, and rewriting a shard
	// drops the dead host's bits for good.
	ix.Record(n, c[:30], nil)
	ix.Query(c, &m)
	if m.Blocks[n.Slot] != 30 || m.Blocks[b.Slot] != 20 {
		t.Fatalf("after new records: %v", m.Blocks)
	}
}

func TestClearForgetsBlocksKeepsSlot(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	ix := newTestIndex(t, st, clk, Config{})
	a, _ := ix.Register("a:1")
	c := chain(4, 30)
	ix.Record(a, c, nil)
	if err := ix.Clear(a); err != nil {
		t.Fatal(err)
	}
	var m Matches
	ix.Query(c, &m)
	if m.Blocks[a.Slot] != 0 {
		t.Fatalf("after Clear: %d", m.Blocks[a.Slot])
	}
	if err := ix.Record(a, c[:10], nil); err != nil {
		t.Fatalf("ref still valid after Clear: %v", err)
	}
	ix.Query(c, &m)
	if m.Blocks[a.Slot] != 10 {
		t.Fatalf("after re-record: %d", m.Blocks[a.Slot])
	}
}

func TestEvictionFollowsRecency(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	ix := newTestIndex(t, st, clk, Config{Hash: HashConfig{LevelBlocks: -1}, BucketMs: 1000})
	a, _ := ix.Register("a:1")
	b, _ := ix.Register("b:1")
	// 100 blocks of 64 tokens.
	if err := ix.SetCapacity(a, 6400); err != nil {
		t.Fatal(err)
	}
	chains := make([][]uint64, 6)
	for i := range chains {
		chains[i] = chain(uint64(100+i), 30)
	}
	var m Matches
	held := func(k int) int {
		ix.Query(chains[k], &m)
		return m.Blocks[a.Slot]
	}
	for k := 0; k < 3; k++ {
		ix.Record(a, chains[k], nil)
		ix.Record(b, chains[k], nil) // b is unbounded
		clk.ms += 1000
	}
	// 90 of 100 units: nothing evicted.
	for k := 0; k < 3; k++ {
		if held(k) != 30 {
			t.Fatalf("chain %d: %d before eviction", k, held(k))
		}
	}
	ix.Record(a, chains[3], nil) // 120 units: the oldest second goes
	clk.ms += 1000
	if held(0) != 0 || held(1) != 30 || held(3) != 30 {
		t.Fatalf("after overflow: %d %d %d, want 0 30 30", held(0), held(1), held(3))
	}
	ix.Record(a, chains[1], nil) // refresh chain 1: now most recent
	clk.ms += 1000
	ix.Record(a, chains[4], nil) // 120 again: chain 2 is the LRU
	if held(1) != 30 || held(2) != 0 || held(4) != 30 {
		t.Fatalf("after refresh and overflow: %d %d %d, want 30 0 30", held(1), held(2), held(4))
	}
	// Another host's blocks are untouched by a's eviction.
	ix.Query(chains[0], &m)
	if m.Blocks[b.Slot] != 30 {
		t.Fatalf("b lost blocks to a's eviction: %d", m.Blocks[b.Slot])
	}
	if ix.Metrics().Evictions != 60 {
		t.Fatalf("Evictions = %d, want 60 units", ix.Metrics().Evictions)
	}
}

func TestRecordSkipsFreshHeldBlocks(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	ix := newTestIndex(t, st, clk, Config{TouchAfterMs: 1000})
	a, _ := ix.Register("a:1")
	c := chain(9, 60)
	var m Matches
	ix.Query(c, &m)
	ix.Record(a, c, &m)
	w0 := ix.Metrics().Writes
	clk.ms += 100
	ix.Query(c, &m)
	if err := ix.Record(a, c, &m); err != nil {
		t.Fatal(err)
	}
	if w := ix.Metrics().Writes - w0; w != 0 {
		t.Fatalf("repeat of a fresh prompt wrote %d values, want 0", w)
	}
	// Once stale, the same record refreshes the chain.
	clk.ms += 5000
	ix.Query(c, &m)
	ix.Record(a, c, &m)
	if w := ix.Metrics().Writes - w0; w == 0 {
		t.Fatal("stale chain not refreshed")
	}
	// Matches for another chain are not trusted.
	d := chain(10, 60)
	ix.Query(c, &m)
	ix.Record(a, d, &m)
	ix.Query(d, &m)
	if m.Blocks[a.Slot] != 60 {
		t.Fatalf("record with foreign matches: %d", m.Blocks[a.Slot])
	}
}

func TestCorrectFromCachedTokens(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	ix := newTestIndex(t, st, clk, Config{Hash: HashConfig{LevelBlocks: -1}})
	a, _ := ix.Register("a:1")
	b, _ := ix.Register("b:1")
	ancient, old, newer := chain(1, 40), chain(2, 40), chain(3, 40)
	ix.Record(a, ancient, nil)
	ix.Record(b, ancient, nil)
	clk.ms += 10_000
	ix.Record(a, old, nil)
	clk.ms += 10_000
	ix.Record(a, newer, nil)
	clk.ms += 10_000
	// The engine behind a had only 10 blocks of "old" (its real capacity
	// is smaller than configured): 30 blocks it lacked were still counted.
	var m Matches
	ix.Query(old, &m)
	stamp := m.Stamp(a.Slot)
	if stamp.Blocks != 40 {
		t.Fatalf("predicted %d", stamp.Blocks)
	}
	ix.Record(a, old, &m) // the request's own record, before the response
	clk.ms += 100
	if moved, _ := ix.Correct(a, stamp, 40); moved {
		t.Fatal("a confirmed prediction moved the horizon")
	}
	moved, err := ix.Correct(a, stamp, 10)
	if err != nil || !moved {
		t.Fatalf("Correct = %v, %v", moved, err)
	}
	held := func(c []uint64, h HostRef) int {
		ix.Query(c, &m)
		return m.Blocks[h.Slot]
	}
	// Under LRU the engine lost what it refreshed before "old": the
	// ancient chain (40 units >= the 30 missing) goes; the newer chain and
	// the request's own blocks stay; b is untouched.
	if held(ancient, a) != 0 || held(ancient, b) != 40 {
		t.Fatalf("ancient: a=%d b=%d, want 0 40", held(ancient, a), held(ancient, b))
	}
	if held(old, a) != 40 || held(newer, a) != 40 {
		t.Fatalf("old %d newer %d, want 40 40", held(old, a), held(newer, a))
	}
	if ix.Metrics().Corrections != 1 {
		t.Fatalf("Corrections = %d", ix.Metrics().Corrections)
	}
}

func TestCorrectNeverEvictsNewerThanTheStamp(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	ix := newTestIndex(t, st, clk, Config{Hash: HashConfig{LevelBlocks: -1}})
	a, _ := ix.Register("a:1")
	old, newer := chain(5, 30), chain(6, 30)
	ix.Record(a, old, nil)
	clk.ms += 5000
	var m Matches
	ix.Query(old, &m)
	stamp := m.Stamp(a.Slot)
	ix.Record(a, newer, nil)
	clk.ms += 5000
	// 30 units missing, but only "old" (30 units) was refreshed no later
	// than the stamp: "newer" must survive even though more was asked.
	if _, err := ix.Correct(a, stamp, 0); err != nil {
		t.Fatal(err)
	}
	ix.Query(old, &m)
	if m.Blocks[a.Slot] != 0 {
		t.Fatalf("stamped chain still counted: %d", m.Blocks[a.Slot])
	}
	ix.Query(newer, &m)
	if m.Blocks[a.Slot] != 30 {
		t.Fatalf("newer chain evicted: %d", m.Blocks[a.Slot])
	}
}

// A reader that holds the current slot table copies only its stamp; a
// table written without its stamp (the writer died between the two sets)
// is picked up within slotsRecheckMs, and the stamp is repaired.
func TestSlotStampSavesTheTableAndRecovers(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	ix := newTestIndex(t, st, clk, Config{})
	var refs []HostRef
	for p := 0; p < MaxSlots; p++ {
		ref, err := ix.Register(fmt.Sprintf("10.9.%d.%d:80", p/200, p%200))
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, ref)
	}
	c := chain(11, 40)
	ix.Record(refs[0], c, nil)
	ix.Record(refs[1], c[:10], nil)
	reader := newTestIndex(t, st, clk, Config{})
	var m Matches
	reader.Query(c, &m)
	tableBytes := slotsHeader + MaxSlots*slotRecord
	if m.BytesRead < tableBytes {
		t.Fatalf("cold query copied %d B, less than the %d B table", m.BytesRead, tableBytes)
	}
	reader.Query(c, &m)
	if m.BytesRead >= tableBytes || m.Blocks[0] != 40 || m.Blocks[1] != 10 {
		t.Fatalf("warm query copied %d B (table %d B), answer %d/%d", m.BytesRead, tableBytes, m.Blocks[0], m.Blocks[1])
	}
	// Another VM removes host 1 but dies before writing the stamp.
	v, _, _ := st.Get(ix.slotsKey)
	var tb slotTable
	if !decodeSlots(v, &tb) {
		t.Fatal("stored table does not decode")
	}
	tb.epoch++
	tb.recs[1].addrHash, tb.recs[1].clearEpoch = 0, tb.epoch
	tb.seq++
	st.Set(ix.slotsKey, encodeSlots(nil, &tb), 0)
	reader.Query(c, &m)
	if m.Blocks[1] != 10 {
		t.Fatalf("within the recheck interval the reader trusts its stamp: host 1 at %d, want 10", m.Blocks[1])
	}
	clk.ms += slotsRecheckMs
	reader.Query(c, &m)
	if m.Blocks[1] != 0 || m.Blocks[0] != 40 {
		t.Fatalf("after the recheck interval: host 1 at %d (want 0), host 0 at %d", m.Blocks[1], m.Blocks[0])
	}
	sv, _, err := st.Get(ix.stampKey)
	if seq, ok := parseStamp(sv); err != nil || !ok || seq != tb.seq {
		t.Fatalf("stamp not repaired: %v %v seq %d, want %d", err, ok, seq, tb.seq)
	}
	// ix still holds the old table; the repaired stamp tells it at once.
	ix.Query(c, &m)
	if m.Blocks[1] != 0 {
		t.Fatalf("a warm VM missed the repaired stamp: host 1 at %d", m.Blocks[1])
	}
	// Writers never reuse a seq, even when the table was replaced.
	st.Set(ix.slotsKey, []byte("garbage"), 0)
	if _, err := ix.Register("10.8.0.1:80"); err != nil {
		t.Fatal(err)
	}
	if seq, _ := parseStamp(mustGet(t, st, ix.stampKey)); int32(seq-tb.seq) <= 0 {
		t.Fatalf("seq %d after a reset table, not above %d", seq, tb.seq)
	}
}

func mustGet(t *testing.T, st Store, key string) []byte {
	t.Helper()
	v, _, err := st.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
