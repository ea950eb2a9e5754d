package index

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

func TestMemStoreFollowsEnvoyRules(t *testing.T) {
	var s MemStore
	if _, _, err := s.Get("k"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of a missing key: %v, want ErrNotFound", err)
	}
	// A missing key is set whatever the CAS.
	if err := s.Set("k", []byte("a"), 12345); err != nil {
		t.Fatalf("Set of a missing key with a CAS: %v", err)
	}
	v, cas1, err := s.Get("k")
	if err != nil || string(v) != "a" || cas1 == 0 {
		t.Fatalf("Get = %q, %d, %v", v, cas1, err)
	}
	// Get copies: changing the returned slice changes nothing stored.
	v[0] = 'z'
	if v2, _, _ := s.Get("k"); string(v2) != "a" {
		t.Fatalf("stored value changed through a returned slice: %q", v2)
	}
	// Set copies too.
	buf := []byte("b")
	if err := s.Set("k", buf, cas1); err != nil {
		t.Fatal(err)
	}
	buf[0] = 'y'
	v, cas2, _ := s.Get("k")
	if string(v) != "b" || cas2 == cas1 {
		t.Fatalf("after CAS set: %q cas %d (was %d)", v, cas2, cas1)
	}
	// A stale CAS is refused and changes nothing.
	if err := s.Set("k", []byte("c"), cas1); !errors.Is(err, ErrCASMismatch) {
		t.Fatalf("stale CAS: %v, want ErrCASMismatch", err)
	}
	if v, cas, _ := s.Get("k"); string(v) != "b" || cas != cas2 {
		t.Fatalf("after refused set: %q %d", v, cas)
	}
	// CAS 0 sets unconditionally.
	if err := s.Set("k", []byte("d"), 0); err != nil {
		t.Fatal(err)
	}
	// One global counter: a set on another key advances it too.
	_, cas3, _ := s.Get("k")
	s.Set("other", []byte("x"), 0)
	_, casOther, _ := s.Get("other")
	if casOther != cas3+1 {
		t.Fatalf("CAS counter not global: k=%d other=%d", cas3, casOther)
	}
	// The counter skips 0 when it wraps.
	s.nextCAS = ^uint32(0) - 1
	s.Set("k", []byte("e"), 0)
	s.Set("k", []byte("f"), 0)
	if _, cas, _ := s.Get("k"); cas != 1 {
		t.Fatalf("after wrap CAS = %d, want 1 (0 is skipped)", cas)
	}
}

// TestCreateRaceIsDetected: two workers find a key missing and both write
// it. With CAS 0 (or the missing key's CAS 0) Envoy would accept both and
// the first write would be lost; the index's create CAS makes the second
// writer see a mismatch and merge.
func TestCreateRaceIsDetected(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1}
	a := newTestIndex(t, st, clk, Config{})
	b := newTestIndex(t, st, clk, Config{})
	_, cas, found := a.getInto(new([]byte), "k")
	if found || cas != 0 {
		t.Fatal("key exists")
	}
	if retry, err := b.set("k", []byte("b"), 0); retry || err != nil {
		t.Fatalf("first create: retry=%v err=%v", retry, err)
	}
	if retry, _ := a.set("k", []byte("a"), cas); !retry {
		t.Fatal("second create overwrote the first")
	}
	if v, _, _ := st.Get("k"); string(v) != "b" {
		t.Fatalf("value %q, want the first writer's", v)
	}
}

func TestMemStoreGetAppendMatchesGetAndReusesDst(t *testing.T) {
	var s MemStore
	dst := make([]byte, 3, 64)
	copy(dst, "xyz")
	if v, cas, err := s.GetAppend(dst[:0], "k"); !errors.Is(err, ErrNotFound) || cas != 0 || len(v) != 0 || cap(v) != 64 {
		t.Fatalf("GetAppend of a missing key = %q (cap %d), %d, %v; want dst unchanged, ErrNotFound", v, cap(v), cas, err)
	}
	s.Set("k", []byte("value-1"), 0)
	want, wantCAS, _ := s.Get("k")
	v, cas, err := s.GetAppend(dst[:0], "k")
	if err != nil || string(v) != string(want) || cas != wantCAS {
		t.Fatalf("GetAppend = %q, %d, %v; Get = %q, %d", v, cas, err, want, wantCAS)
	}
	if &v[0] != &dst[0] {
		t.Fatal("GetAppend allocated although dst had room")
	}
	// It appends, like the strconv Append functions.
	copy(dst[:3], "xyz")
	if v, _, _ := s.GetAppend(dst[:3], "k"); string(v) != "xyzvalue-1" {
		t.Fatalf("GetAppend(dst[:3]) = %q, want the value after dst's bytes", v)
	}
	// The result is the caller's: editing it changes nothing stored.
	v[0] = 'Z'
	if again, _, _ := s.Get("k"); string(again) != "value-1" {
		t.Fatalf("stored value changed through GetAppend's result: %q", again)
	}
	// A value larger than dst's capacity grows it.
	big := make([]byte, 100)
	s.Set("k", big, 0)
	if v, _, _ := s.GetAppend(dst[:0], "k"); len(v) != 100 || cap(dst) != 64 {
		t.Fatalf("GetAppend of a 100-byte value into a 64-byte buffer: len %d", len(v))
	}
}

// getOnlyStore hides MemStore's GetAppend: a Store with only the
// interface's two methods, like a filter adapter that has nothing better
// than the SDK's GetSharedData.
type getOnlyStore struct{ m *MemStore }

func (s getOnlyStore) Get(key string) ([]byte, uint32, error) { return s.m.Get(key) }
func (s getOnlyStore) Set(key string, value []byte, cas uint32) error {
	return s.m.Set(key, value, cas)
}

// TestAppendGetterChangesNothingButAllocations runs one random workload
// twice, on a MemStore (the index reads into its own buffers) and on a
// store without GetAppend (a fresh slice per read): every answer, error
// and counter, and every stored value and CAS, must be the same. The
// workload is built to reach every buffer path: two VMs interleaved
// (shards changed under a VM's feet, CAS retries), few small shards (a
// Record's segments sharing a shard after its Query copied it; full
// shards cleaned, overflows), host capacities (horizons), removals and
// slot reuse (stale bits, bitmaps widened past 64 hosts) and corrupt
// values written over shards, the stamp and usage histograms.
func TestAppendGetterChangesNothingButAllocations(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		fast, plain := &MemStore{}, &MemStore{}
		a := appendWorkload(t, seed, fast)
		b := appendWorkload(t, seed, getOnlyStore{plain})
		if len(a) != len(b) {
			t.Fatalf("seed %d: %d events with GetAppend, %d without", seed, len(a), len(b))
		}
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("seed %d: event %d differs:\n  GetAppend: %s\n  Get only:  %s", seed, i, a[i], b[i])
			}
		}
		if len(fast.entries) != len(plain.entries) || fast.nextCAS != plain.nextCAS {
			t.Fatalf("seed %d: stores differ: %d keys (CAS %d) against %d (CAS %d)",
				seed, len(fast.entries), fast.nextCAS, len(plain.entries), plain.nextCAS)
		}
		for k, e := range fast.entries {
			p, ok := plain.entries[k]
			if !ok || string(p.value) != string(e.value) || p.cas != e.cas {
				t.Fatalf("seed %d: key %q differs: %x (CAS %d) against %x (CAS %d)", seed, k, e.value, e.cas, p.value, p.cas)
			}
		}
	}
}

// appendWorkload runs seed's workload on st and returns what it saw, one
// line per operation.
func appendWorkload(t *testing.T, seed uint64, st Store) []string {
	rng := rand.New(rand.NewPCG(seed, 7))
	clk := &fakeClock{ms: 3_000_000}
	cfg := Config{Shards: 16, ShardEntries: 24, Hash: HashConfig{LevelBlocks: 8}}
	vms := []*Index{newTestIndex(t, st, clk, cfg), newTestIndex(t, st, clk, cfg)}
	system := chain(seed*77, 10)
	var chains [][]uint64
	for k := 0; k < 12; k++ {
		c := append([]uint64(nil), system[:rng.IntN(len(system))]...)
		chains = append(chains, append(c, chain(seed*77+uint64(k)+1, 8+rng.IntN(60))...))
	}
	nHosts := 60 + rng.IntN(20) // past 64 slots with the replacements below
	addrs := make([]string, nHosts)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.%d.0.%d:8000", seed, i)
		ref, err := vms[0].Register(addrs[i])
		if err != nil {
			t.Fatal(err)
		}
		vms[0].SetCapacity(ref, 200+rng.IntN(2000))
	}
	var out []string
	var m Matches
	for op := 0; op < 1500; op++ {
		clk.ms += int64(rng.IntN(400))
		ix := vms[rng.IntN(len(vms))]
		addr := addrs[rng.IntN(nHosts)]
		c := chains[rng.IntN(len(chains))]
		c = c[:1+rng.IntN(len(c))]
		switch r := rng.IntN(100); {
		case r < 50: // a routing decision
			err := ix.Query(c, &m)
			ref, ok := ix.Lookup(addr)
			err2 := ix.Record(ref, c, &m)
			out = append(out, fmt.Sprintf("%d query %v %v reads %d/%d; record %v %v %v", op, err, m.Blocks, m.Reads, m.BytesRead, ok, ref, err2))
		case r < 65: // a record without its query
			ref, _ := ix.Lookup(addr)
			out = append(out, fmt.Sprintf("%d record %v", op, ix.Record(ref, c, nil)))
		case r < 72:
			ref, _ := ix.Lookup(addr)
			from := rng.IntN(len(c))
			out = append(out, fmt.Sprintf("%d removed %v", op, ix.Removed(ref, c, from)))
		case r < 75:
			ref, _ := ix.Lookup(addr)
			out = append(out, fmt.Sprintf("%d clear %v", op, ix.Clear(ref)))
		case r < 79: // the host leaves, another takes a slot
			err := ix.Remove(addr)
			i := rng.IntN(nHosts)
			addrs[i] = fmt.Sprintf("10.%d.1.%d:8000", seed, op)
			ref, err2 := ix.Register(addrs[i])
			err3 := ix.SetCapacity(ref, 200+rng.IntN(2000))
			out = append(out, fmt.Sprintf("%d remove %v register %v %v %v", op, err, ref, err2, err3))
		case r < 83: // garbage over a value the index reads
			keys := []string{ix.shardKeys[rng.IntN(len(ix.shardKeys))], ix.stampKey, ix.usageKeys[rng.IntN(nHosts)]}
			junk := make([]byte, rng.IntN(40))
			for i := range junk {
				junk[i] = byte(rng.IntN(256))
			}
			if rng.IntN(2) == 0 && len(junk) >= 3 {
				junk[0], junk[1], junk[2] = shardMagic0, shardMagic1, formatVersion
			}
			out = append(out, fmt.Sprintf("%d junk %v", op, st.Set(keys[rng.IntN(len(keys))], junk, 0)))
		default: // a query alone, sometimes a VM's first of the prefix
			if rng.IntN(2) == 0 {
				ix.hints = [hintLines]hintLine{}
			}
			err := ix.Query(c, &m)
			out = append(out, fmt.Sprintf("%d query %v %v reads %d/%d", op, err, m.Blocks, m.Reads, m.BytesRead))
		}
	}
	for i, ix := range vms {
		out = append(out, fmt.Sprintf("vm %d metrics %+v", i, ix.Metrics()))
	}
	if mt := vms[0].Metrics(); mt.Overflows == 0 || mt.Corrupt == 0 || mt.Evictions == 0 {
		t.Fatalf("seed %d: the workload missed a path (overflows, corrupt values, evictions): %+v", seed, mt)
	}
	return out
}

// getAppender, the index's AppendGetter over a Store with only Get, answers
// as GetAppend must: appended to dst, dst untouched on a miss.
func TestGetAppenderAppendsGet(t *testing.T) {
	m := &MemStore{}
	m.Set("k", []byte("value"), 0)
	g := &getAppender{getOnlyStore{m}}
	_, wantCAS, _ := m.Get("k")
	if v, cas, err := g.GetAppend(nil, "k"); err != nil || string(v) != "value" || cas != wantCAS {
		t.Fatalf("GetAppend(nil, k) = %q, %d, %v; want value, %d", v, cas, err, wantCAS)
	}
	dst := append(make([]byte, 0, 16), "kept:"...)
	if v, _, err := g.GetAppend(dst, "k"); err != nil || string(v) != "kept:value" {
		t.Fatalf("GetAppend(kept:, k) = %q, %v; want kept:value", v, err)
	}
	if v, cas, err := g.GetAppend(dst, "missing"); err != ErrNotFound || string(v) != "kept:" || cas != 0 {
		t.Fatalf("GetAppend(kept:, missing) = %q, %d, %v; want kept:, 0, ErrNotFound", v, cas, err)
	}
}

// errStore wraps MemStore's errors, as an adapter formatting them would,
// and fails every key in broken with an error of its own.
type errStore struct {
	m      *MemStore
	broken map[string]bool
}

var errBroken = errors.New("broken key")

func (s errStore) Get(key string) ([]byte, uint32, error) {
	if s.broken[key] {
		return nil, 0, errBroken
	}
	v, cas, err := s.m.Get(key)
	if err != nil {
		err = fmt.Errorf("get %s: %w", key, err)
	}
	return v, cas, err
}

func (s errStore) Set(key string, value []byte, cas uint32) error {
	if s.broken[key] {
		return errBroken
	}
	if err := s.m.Set(key, value, cas); err != nil {
		return fmt.Errorf("set %s: %w", key, err)
	}
	return nil
}

// Reads and writes book their failures by kind: a missing key (even
// wrapped) is no store error, a wrapped CAS mismatch is retried, anything
// else is a store error; a failed read leaves the caller an empty buffer.
func TestReadAndWriteFailuresAreBookedByKind(t *testing.T) {
	st := errStore{m: &MemStore{}, broken: map[string]bool{"bad": true}}
	ix := newTestIndex(t, st, &fakeClock{ms: 1}, Config{})
	buf := []byte("old")
	if v, cas, found := ix.getInto(&buf, "missing"); found || cas != 0 || len(v) != 0 || len(buf) != 0 {
		t.Fatalf("missing key: %q, %d, %v (buffer %q)", v, cas, found, buf)
	}
	if m := ix.Metrics(); m.StoreErrors != 0 || m.Reads != 1 {
		t.Fatalf("a wrapped ErrNotFound was booked as a store error: %+v", m)
	}
	if _, _, found := ix.getInto(&buf, "bad"); found || ix.Metrics().StoreErrors != 1 {
		t.Fatalf("a broken key: found %v, metrics %+v", found, ix.Metrics())
	}
	if retry, err := ix.set("k", []byte("v"), 0); retry || err != nil {
		t.Fatalf("create: retry %v, %v", retry, err)
	}
	if retry, err := ix.set("k", []byte("w"), 12345); !retry || !errors.Is(err, ErrCASMismatch) || ix.Metrics().CASRetries != 1 {
		t.Fatalf("stale CAS: retry %v, %v, metrics %+v", retry, err, ix.Metrics())
	}
	if retry, err := ix.set("bad", []byte("v"), 0); retry || err != errBroken || ix.Metrics().StoreErrors != 2 {
		t.Fatalf("broken key: retry %v, %v, metrics %+v", retry, err, ix.Metrics())
	}
	if m := ix.Metrics(); m.Writes != 1 || m.BytesWritten != 1 {
		t.Fatalf("writes booked: %+v", m)
	}
}
