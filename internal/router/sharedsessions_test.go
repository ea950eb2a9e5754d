package router

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/index"
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
