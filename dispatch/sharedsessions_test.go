package dispatch

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scorer"
)

// Two workers (two tables over one shared store) see each other's pins,
// a re-pin replaces the old address, and the store never holds the
// session key itself.
func TestSharedSessionsAreOneTablePerGateway(t *testing.T) {
	store := &index.MemStore{}
	a, b := NewSharedSessions(store), NewSharedSessions(store)
	if _, ok := b.Get("conv-1"); ok {
		t.Fatal("empty table has a pin")
	}
	a.Put("conv-1", "10.0.0.1:8000")
	if got, ok := b.Get("conv-1"); !ok || got != "10.0.0.1:8000" {
		t.Fatalf("other worker reads %q %v, want 10.0.0.1:8000", got, ok)
	}
	b.Put("conv-1", "10.0.0.2:8000")
	if got, _ := a.Get("conv-1"); got != "10.0.0.2:8000" {
		t.Fatalf("after the re-pin the first worker reads %q", got)
	}
	for i := range SessionBuckets {
		v, _, err := store.Get(sessionKeys[i])
		if err == nil && bytes.Contains(v, []byte("conv-1")) {
			t.Fatal("the table stores the session key in clear")
		}
	}
}

// A full bucket drops its oldest pin and keeps the newest
// SessionsPerBucket; the table as a whole holds about its capacity.
func TestSharedSessionsBoundedPerBucket(t *testing.T) {
	s := NewSharedSessions(&index.MemStore{})
	n := SessionBuckets * SessionsPerBucket * 2
	for i := range n {
		s.Put(fmt.Sprintf("s%d", i), "10.0.0.1:8000")
	}
	recent, old := 0, 0
	for i := range 1000 {
		if _, ok := s.Get(fmt.Sprintf("s%d", n-1-i)); ok {
			recent++
		}
		if _, ok := s.Get(fmt.Sprintf("s%d", i)); ok {
			old++
		}
	}
	if recent < 990 || old > 10 {
		t.Fatalf("of the 1000 newest pins %d kept, of the 1000 oldest %d kept", recent, old)
	}
}

// A torn or foreign bucket value reads as no pin and is replaced by the
// next Put, never a panic.
func TestSharedSessionsSurviveGarbage(t *testing.T) {
	store := &index.MemStore{}
	s := NewSharedSessions(store)
	for i := range SessionBuckets {
		if err := store.Set(sessionKeys[i], []byte{1, 2, 3, 4, 5, 6, 7, 8, 200, 'x'}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := s.Get("k"); ok {
		t.Fatal("garbage read as a pin")
	}
	s.Put("k", "10.0.0.3:8000")
	if got, ok := s.Get("k"); !ok || got != "10.0.0.3:8000" {
		t.Fatalf("after garbage, Put then Get gives %q %v", got, ok)
	}
}

func memChain(seed uint64, n int) []uint64 {
	c := make([]uint64, n)
	for i := range c {
		c[i] = seed*1_000_003 + uint64(i) + 1
	}
	return c
}

// The gateway's prefix memory: what one worker stores, another finds, at
// the deepest depth the two chains share; a longer follow-up finds its
// shorter predecessor's host; a store that changes nothing writes nothing.
func TestSharedMemoryIsOnePerGateway(t *testing.T) {
	store := &index.MemStore{}
	a, b := newSharedMemory(store), newSharedMemory(store)
	hosts := []scorer.Host{{Address: "10.0.0.1:8000"}, {Address: "10.0.0.2:8000"}}
	turn1 := memChain(1, 20)
	if i := a.lookup(turn1, hosts); i != -1 {
		t.Fatalf("empty memory names host %d", i)
	}
	a.store(turn1, "10.0.0.2:8000")
	turn2 := append(append([]uint64(nil), turn1...), memChain(9, 30)...) // 50 blocks, turn1 its prefix
	if i := b.lookup(turn2, hosts); i != 1 {
		t.Fatalf("the other worker's lookup of the follow-up gives host %d, want 1", i)
	}
	// A sibling sharing only the first 8 blocks, routed elsewhere, takes
	// the shallow depth; the follow-up still finds its deeper match.
	sib := append(append([]uint64(nil), turn1[:8]...), memChain(5, 12)...)
	b.store(sib, "10.0.0.1:8000")
	if i := a.lookup(turn2, hosts); i != 1 {
		t.Fatalf("after a sibling, the follow-up gives host %d, want 1 (deepest match)", i)
	}
	if i := a.lookup(sib, hosts); i != 0 {
		t.Fatalf("the sibling gives host %d, want 0", i)
	}
	_, cas1, _ := store.Get(a.bucket(turn1))
	a.lookup(sib, hosts)
	a.store(sib, "10.0.0.1:8000")
	if _, cas2, _ := store.Get(a.bucket(turn1)); cas2 != cas1 {
		t.Fatal("storing what the bucket already says wrote it again")
	}
	if i := a.lookup(memChain(3, 7), hosts); i != -1 {
		t.Fatal("a chain shorter than the memory's shallowest depth was found")
	}
}

// A bucket keeps its newest entries: many prompts sharing their first
// blocks push the oldest out, never grow the value without bound.
func TestSharedMemoryBucketIsBounded(t *testing.T) {
	store := &index.MemStore{}
	m := newSharedMemory(store)
	hosts := []scorer.Host{{Address: "10.0.0.1:8000"}}
	base := memChain(1, 8)
	var last []uint64
	for i := range 200 {
		c := append(append([]uint64(nil), base...), memChain(uint64(100+i), 8)...)
		m.lookup(c, hosts)
		m.store(c, "10.0.0.1:8000")
		last = c
	}
	v, _, _ := store.Get(m.bucket(base))
	if len(v) > memoryPerBucket*(9+len("10.0.0.1:8000")) {
		t.Fatalf("bucket holds %d bytes, more than %d entries", len(v), memoryPerBucket)
	}
	if m.lookup(last, hosts) != 0 {
		t.Fatal("the newest prompt was dropped")
	}
}
