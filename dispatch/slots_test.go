package dispatch

import (
	"testing"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scorer"
)

// candidates returns hosts for addrs carrying the slots prev gave them
// (Slot -1 for a new address), as the filter rebuilds its candidates.
func candidates(prev []scorer.Host, addrs ...string) []scorer.Host {
	hs := make([]scorer.Host, len(addrs))
	for i, a := range addrs {
		hs[i] = scorer.Host{Address: a, Slot: -1}
		for _, p := range prev {
			if p.Address == a {
				hs[i].Slot, hs[i].Gen = p.Slot, p.Gen
			}
		}
	}
	return hs
}

// SetHosts writes the slot table only when the candidates or their facts
// change, frees the slots of hosts that left pushed state once nothing is
// in flight on them, and leaves static endpoints' departed slots alone.
func TestSetHostsAppliesOnlyWhatChanged(t *testing.T) {
	now := int64(1 << 30)
	d, err := NewShared(Config{Handler: mustHandler(t, "least_request"), Shared: &index.MemStore{}}, func() int64 { return now })
	if err != nil {
		t.Fatal(err)
	}
	ix := d.Index()
	facts := []HostFacts{{CapacityTokens: 1000}, {CapacityTokens: 2000}}
	hs := candidates(nil, "a:1", "b:1")
	if rep := d.SetHosts(hs, facts, true, now); rep.Err != nil || rep.Unassigned != 0 {
		t.Fatalf("first push: %+v", rep)
	}
	if hs[0].Slot < 0 || hs[1].Slot < 0 || hs[0].Slot == hs[1].Slot {
		t.Fatalf("slots %d and %d: want two distinct slots", hs[0].Slot, hs[1].Slot)
	}
	before := ix.Metrics()
	again := candidates(hs, "a:1", "b:1")
	d.SetHosts(again, facts, true, now)
	after := ix.Metrics()
	if got := after.Writes - before.Writes; got != 0 {
		t.Errorf("the same push again wrote %d times, want 0", got)
	}
	// The usual push reads the table's stamp, not the table.
	if got := after.BytesRead - before.BytesRead; got > 8 {
		t.Errorf("the same push again read %d bytes of shared data, want at most the 8-byte stamp", got)
	}
	if again[0].Slot != hs[0].Slot || again[1].Slot != hs[1].Slot {
		t.Errorf("the same push moved the slots: %+v", again)
	}
	// A new capacity is applied once.
	facts[1].CapacityTokens = 3000
	d.SetHosts(candidates(again, "a:1", "b:1"), facts, true, now)
	writes := ix.Metrics().Writes
	d.SetHosts(candidates(again, "a:1", "b:1"), facts, true, now)
	if got := ix.Metrics().Writes - writes; got != 0 {
		t.Errorf("an applied capacity was written again (%d writes)", got)
	}

	// Static endpoints speak only for themselves: b keeps its slot.
	static := candidates(again, "a:1")
	d.SetHosts(static, nil, false, now)
	if _, ok := d.Lookup("b:1"); !ok {
		t.Fatal("static endpoints freed the slot of a host they do not list")
	}
	// Pushed state speaks for the gateway: b's slot is freed (nothing in
	// flight on it).
	pushed := candidates(static, "a:1")
	if rep := d.SetHosts(pushed, facts[:1], true, now); rep.Freed != 1 {
		t.Fatalf("a push without b freed %d slots, want 1", rep.Freed)
	}
	if _, ok := d.Lookup("b:1"); ok {
		t.Fatal("b kept its slot after leaving pushed state")
	}
	if rep := d.Housekeep(pushed, now+1000); rep.Err != nil || rep.Freed != 0 {
		t.Errorf("housekeeping with nothing to do: %+v", rep)
	}
}

// A departed host with a request in flight keeps its slot until the
// request ends (Housekeep then frees it) or SlotGraceMs passes.
func TestSetHostsKeepsABusyDepartedSlot(t *testing.T) {
	now := int64(1 << 30)
	d, err := NewShared(Config{Handler: mustHandler(t, "least_request"), Shared: &index.MemStore{}}, func() int64 { return now })
	if err != nil {
		t.Fatal(err)
	}
	hs := candidates(nil, "a:1", "b:1")
	d.SetHosts(hs, nil, true, now)
	tk, _ := d.Decide(&Input{NowMs: now}, hs[1:]) // one request on b
	if tk.Address != "b:1" {
		t.Fatalf("decided %q", tk.Address)
	}
	left := candidates(hs, "a:1")
	if rep := d.SetHosts(left, nil, true, now); rep.Freed != 0 {
		t.Fatalf("b's slot was freed with a request in flight (%+v)", rep)
	}
	if _, ok := d.Lookup("b:1"); !ok {
		t.Fatal("b lost its slot with a request in flight")
	}
	d.Release(&tk)
	if rep := d.Housekeep(left, now+1000); rep.Freed != 1 {
		t.Fatalf("housekeeping after the request ended freed %d slots, want 1", rep.Freed)
	}

	// Grace: a slot whose count never returns is freed after SlotGraceMs.
	hs = candidates(left, "a:1", "c:1")
	d.SetHosts(hs, nil, true, now)
	stuck, _ := d.Decide(&Input{NowMs: now}, hs[1:])
	_ = stuck // never released: a worker that died
	left = candidates(hs, "a:1")
	d.SetHosts(left, nil, true, now)
	if rep := d.Housekeep(left, now+SlotGraceMs-1); rep.Freed != 0 {
		t.Fatalf("freed before the grace ended: %+v", rep)
	}
	if rep := d.Housekeep(left, now+SlotGraceMs); rep.Freed != 1 {
		t.Fatalf("not freed when the grace ended: %+v", rep)
	}
}
