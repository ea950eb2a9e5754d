package index

import (
	"errors"
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
	_, cas, found := a.get("k")
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
