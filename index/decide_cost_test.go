package index

import (
	"fmt"
	"testing"
)

// A pinned clock replaces every read of Config.Now until unpinned: ages
// recorded under the pin are the pinned time's.
func TestPinClockReplacesConfigNow(t *testing.T) {
	st := &MemStore{}
	calls := 0
	clk := &fakeClock{ms: 1_000_000}
	ix, err := New(st, Config{Shards: 256, Now: func() int64 { calls++; return clk.ms }})
	if err != nil {
		t.Fatal(err)
	}
	a, err := ix.Register("10.0.0.1:8000")
	if err != nil {
		t.Fatal(err)
	}
	c := chain(3, 40)
	pinned := int64(5_000_000)
	ix.PinClock(pinned)
	calls = 0
	var m Matches
	if err := ix.Query(c, &m); err != nil {
		t.Fatal(err)
	}
	if err := ix.Record(a, c, &m); err != nil {
		t.Fatal(err)
	}
	if err := ix.Query(c, &m); err != nil {
		t.Fatal(err)
	}
	if calls != 0 {
		t.Errorf("Config.Now called %d times under a pinned clock, want 0", calls)
	}
	if m.Blocks[a.Slot] != len(c) {
		t.Fatalf("matched %d blocks, want %d", m.Blocks[a.Slot], len(c))
	}
	if got, want := m.ages[a.Slot], uint32(pinned>>ageShift); got != want {
		t.Errorf("age of the recorded blocks = %d, want the pinned clock's %d (Config.Now's would be %d)", got, want, uint32(clk.ms>>ageShift))
	}
	ix.UnpinClock()
	if err := ix.Query(c, &m); err != nil {
		t.Fatal(err)
	}
	if calls == 0 {
		t.Errorf("Config.Now not called after UnpinClock")
	}
}

// AddLoad right after Loads starts from the value Loads read (one read
// fewer); a write by another VM in between makes the CAS fail and the
// update is retried on a fresh read, so no count is lost.
func TestAddLoadAfterLoadsReusesTheRead(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	ix := newTestIndex(t, st, clk, Config{})
	other := newTestIndex(t, st, clk, Config{})
	var refs []HostRef
	for i := 0; i < 4; i++ {
		r, err := ix.Register(fmt.Sprintf("h%d:1", i))
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, r)
	}
	if _, err := other.AddLoad(refs[1], 1, 1); err != nil { // the key exists
		t.Fatal(err)
	}
	var loads []Load
	loads = ix.Loads(loads)
	reads := ix.Metrics().Reads
	tk, err := ix.AddLoadKV(refs[0], 100, 10, 110)
	if err != nil {
		t.Fatal(err)
	}
	if d := ix.Metrics().Reads - reads; d != 0 {
		t.Errorf("AddLoad after Loads read the key %d times, want 0", d)
	}
	// Only the first update after Loads may reuse it.
	reads = ix.Metrics().Reads
	if err := ix.PrefillDone(&tk); err != nil {
		t.Fatal(err)
	}
	if d := ix.Metrics().Reads - reads; d != 1 {
		t.Errorf("PrefillDone read the key %d times, want 1", d)
	}
	// Another VM writes between Loads and AddLoad.
	loads = ix.Loads(loads)
	if _, err := other.AddLoadKV(refs[0], 5, 5, 10); err != nil {
		t.Fatal(err)
	}
	retries := ix.Metrics().CASRetries
	if _, err := ix.AddLoadKV(refs[0], 1000, 0, 1000); err != nil {
		t.Fatal(err)
	}
	if ix.Metrics().CASRetries != retries+1 {
		t.Errorf("CAS retries %d -> %d, want one (the stale reused read)", retries, ix.Metrics().CASRetries)
	}
	loads = ix.Loads(loads)
	want := Load{InFlight: 3, PrefillTokens: 1005, DecodeTokens: 15, KVTokens: 1120}
	if loads[refs[0].Slot] != want {
		t.Errorf("load = %+v, want %+v", loads[refs[0].Slot], want)
	}
	if loads[refs[1].Slot] != (Load{InFlight: 1, PrefillTokens: 1, DecodeTokens: 1}) {
		t.Errorf("other host's load = %+v", loads[refs[1].Slot])
	}
}

// An update of a slot the stored value already has edits the value read
// in place; it must store the bytes a rebuild would (reserved bytes
// zeroed, length and other slots unchanged).
func TestLoadUpdateInPlaceMatchesRebuild(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	ix := newTestIndex(t, st, clk, Config{})
	var refs []HostRef
	for i := 0; i < 3; i++ {
		r, err := ix.Register(fmt.Sprintf("h%d:1", i))
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, r)
	}
	if _, err := ix.AddLoadKV(refs[2], 7, 8, 9); err != nil { // the value covers slots 0..2
		t.Fatal(err)
	}
	v, _, _ := st.Get(ix.loadKey)
	v[3], v[6], v[7] = 0xAA, 0xBB, 0xCC // reserved bytes another writer left set
	if err := st.Set(ix.loadKey, v, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := ix.AddLoadKV(refs[0], 100, 10, 110); err != nil {
		t.Fatal(err)
	}
	got, _, _ := st.Get(ix.loadKey)
	want := append([]byte(nil), v...)
	want[3], want[6], want[7] = 0, 0, 0
	r := want[loadHeader+refs[0].Slot*loadRecord:]
	le.PutUint32(r, refs[0].Gen)
	le.PutUint32(r[4:], 1)
	le.PutUint32(r[8:], 100)
	le.PutUint32(r[12:], 10)
	le.PutUint32(r[16:], 110)
	if string(got) != string(want) {
		t.Fatalf("stored\n%x\nwant\n%x", got, want)
	}
}
