package index

import (
	"fmt"
	"sync"
	"testing"
)

// sizedStore is a Store that knows every key written and its size: shared
// data in Envoy cannot delete keys, so what was ever written is the
// footprint.
type sizedStore struct {
	MemStore
	mu    sync.Mutex
	sizes map[string]int
}

func (s *sizedStore) Set(key string, v []byte, cas uint32) error {
	err := s.MemStore.Set(key, v, cas)
	if err == nil {
		s.mu.Lock()
		if s.sizes == nil {
			s.sizes = map[string]int{}
		}
		s.sizes[key] = len(v)
		s.mu.Unlock()
	}
	return err
}

func (s *sizedStore) footprint() (keys, bytes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, n := range s.sizes {
		keys++
		bytes += len(k) + n
	}
	return keys, bytes
}

func churnHosts(push, n int) []SyncHost {
	hs := make([]SyncHost, n)
	for i := range hs {
		a := push*n + i
		hs[i] = SyncHost{Addr: fmt.Sprintf("10.%d.%d.%d:8000", a>>16, a>>8&255, a&255), CapacityTokens: -1}
	}
	return hs
}

// freeIdle frees departed slots with nothing in flight and offers the
// others for reuse, as the filter does before its grace period ends.
func freeIdle(d Departed) Fate {
	if d.InFlight == 0 {
		return FreeSlot
	}
	return ReuseSlot
}

// 10,000 distinct addresses churned through candidate sets of 60, applied
// by two workers: the hosts of the last set get slots, prefix matching and
// load accounting, and the shared data stops growing once every slot has
// been used.
func TestSyncChurnKeepsSlotsForTheLatestHosts(t *testing.T) {
	st := &sizedStore{}
	clk := &fakeClock{ms: 1e6}
	a := newTestIndex(t, st, clk, Config{})
	b := newTestIndex(t, st, clk, Config{})
	prompts := [][]uint64{chain(1, 24), chain(2, 24), chain(3, 24)}
	const perPush = 60
	pushes := 10000 / perPush
	var refs []HostRef
	var keysAt, bytesAt int
	var res SyncResult
	var err error
	var held LoadTicket // one request in flight across each push
	for p := 0; p <= pushes; p++ {
		hosts := churnHosts(p, perPush)
		clk.ms += 1000
		for _, ix := range []*Index{a, b} {
			if refs, res, err = ix.Sync(hosts, refs, freeIdle); err != nil {
				t.Fatalf("push %d: %v", p, err)
			}
			if res.Unassigned != 0 {
				t.Fatalf("push %d: %d hosts without a slot (%+v)", p, res.Unassigned, res)
			}
		}
		if err := a.Release(&held); err != nil {
			t.Fatal(err)
		}
		// Traffic on the new hosts: records and load.
		for i, c := range prompts {
			if err := a.Record(refs[i], c, nil); err != nil {
				t.Fatalf("push %d: record: %v", p, err)
			}
		}
		if held, err = b.AddLoad(refs[p%perPush], 100, 10); err != nil {
			t.Fatalf("push %d: AddLoad: %v", p, err)
		}
		if p == pushes/2 {
			keysAt, bytesAt = st.footprint()
		}
	}
	// The last hosts: matches as recorded, load as counted.
	var m Matches
	for i, c := range prompts {
		if err := b.Query(c, &m); err != nil {
			t.Fatal(err)
		}
		for j := range refs {
			want := 0
			if j == i {
				want = len(c)
			}
			if got := m.Blocks[refs[j].Slot]; got != want {
				t.Errorf("prompt %d: host %d (slot %d) matches %d blocks, want %d", i, j, refs[j].Slot, got, want)
			}
		}
	}
	loads := a.Loads(nil)
	if l := loads[held.Host().Slot]; l.InFlight != 1 || l.PrefillTokens != 100 {
		t.Errorf("the last host's load = %+v, want the request in flight", l)
	}
	for j, r := range refs {
		if r.Slot != held.Host().Slot && loads[r.Slot] != (Load{}) {
			t.Errorf("host %d (slot %d) starts with load %+v, want none", j, r.Slot, loads[r.Slot])
		}
	}
	keys, bytes := st.footprint()
	t.Logf("shared data after %d addresses: %d keys, %d bytes (%d keys, %d bytes halfway)", (pushes+1)*perPush, keys, bytes, keysAt, bytesAt)
	if keys != keysAt || bytes > bytesAt+bytesAt/10 {
		t.Errorf("shared data grew from %d keys, %d bytes halfway to %d keys, %d bytes: churn must reuse slots", keysAt, bytesAt, keys, bytes)
	}
	if n := a.Slots(); n > MaxSlots {
		t.Errorf("table length %d", n)
	}
}

// Two workers applying the same candidate sets at once write one
// consistent table: every address one slot, the same for both, and no slot
// for two addresses.
func TestSyncConcurrentWorkersAgree(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	workers := []*Index{newTestIndex(t, st, clk, Config{}), newTestIndex(t, st, clk, Config{})}
	for p := 0; p < 40; p++ {
		hosts := churnHosts(p, 60)
		if p%3 == 0 { // some hosts stay across pushes
			hosts = append(hosts, churnHosts(1000, 20)...)
		}
		refs := make([][]HostRef, len(workers))
		var wg sync.WaitGroup
		for w, ix := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var err error
				if refs[w], _, err = ix.Sync(hosts, nil, freeIdle); err != nil {
					t.Errorf("push %d worker %d: %v", p, w, err)
				}
			}()
		}
		wg.Wait()
		bySlot := map[int]string{}
		for i, h := range hosts {
			r0, r1 := refs[0][i], refs[1][i]
			if r0 != r1 || r0.Slot < 0 {
				t.Fatalf("push %d: %s got %+v on one worker, %+v on the other", p, h.Addr, r0, r1)
			}
			if other, ok := bySlot[r0.Slot]; ok {
				t.Fatalf("push %d: slot %d given to %s and %s", p, r0.Slot, other, h.Addr)
			}
			bySlot[r0.Slot] = h.Addr
			if got, ok := workers[p%2].Lookup(h.Addr); !ok || got != r0 {
				t.Fatalf("push %d: the table holds %s as %+v (%v), Sync said %+v", p, h.Addr, got, ok, r0)
			}
		}
	}
}

// A departed host keeps its slot while requests are in flight on it (or
// its Fate says so), and gives it up when a new host needs it.
func TestSyncDepartedSlotFates(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	ix := newTestIndex(t, st, clk, Config{})
	old := []SyncHost{{Addr: "10.0.0.1:80", CapacityTokens: -1}, {Addr: "10.0.0.2:80", CapacityTokens: -1}}
	refs, _, err := ix.Sync(old, nil, freeIdle)
	if err != nil {
		t.Fatal(err)
	}
	c := chain(9, 16)
	ix.Record(refs[0], c, nil)
	busy, _ := ix.AddLoad(refs[0], 10, 1)
	// Both leave; the busy one is kept, the idle one freed.
	next := []SyncHost{{Addr: "10.0.0.3:80", CapacityTokens: -1}}
	_, res, err := ix.Sync(next, nil, freeIdle)
	if err != nil || res.Freed != 1 || res.Kept != 1 || res.Registered != 1 {
		t.Fatalf("Sync = %+v, %v; want 1 freed (idle), 1 kept (in flight), 1 registered", res, err)
	}
	if _, ok := ix.Lookup("10.0.0.1:80"); !ok {
		t.Fatal("the host with a request in flight lost its slot")
	}
	if _, ok := ix.Lookup("10.0.0.2:80"); ok {
		t.Fatal("the idle departed host kept its slot")
	}
	// The request ends: the next Sync frees the slot, and its bits stop
	// counting for every reader.
	ix.Release(&busy)
	if _, res, _ = ix.Sync(next, nil, freeIdle); res.Freed != 1 {
		t.Fatalf("after the request ended: %+v, want the slot freed", res)
	}
	var m Matches
	ix.Query(c, &m)
	if refs[0].Slot < len(m.Blocks) && m.Blocks[refs[0].Slot] != 0 {
		t.Errorf("a freed slot still matches %d blocks", m.Blocks[refs[0].Slot])
	}
	// KeepSlot never frees; a full table of kept slots leaves new hosts
	// without one, and ReuseSlot hands them over.
	fill := churnHosts(7, MaxSlots)
	if _, res, _ = ix.Sync(fill, nil, freeIdle); res.Unassigned != 0 {
		t.Fatalf("filling the table: %+v", res)
	}
	keep := func(Departed) Fate { return KeepSlot }
	refs, res, _ = ix.Sync(churnHosts(8, 2), nil, keep)
	if res.Unassigned != 2 || refs[0].Slot != -1 || res.Kept != MaxSlots {
		t.Fatalf("full table, departed kept: %+v %+v", res, refs)
	}
	reuse := func(Departed) Fate { return ReuseSlot }
	refs, res, _ = ix.Sync(churnHosts(8, 2), nil, reuse)
	if res.Unassigned != 0 || res.Freed != 2 || res.Kept != MaxSlots-2 || refs[0].Slot < 0 || refs[1].Slot < 0 {
		t.Fatalf("full table, departed offered for reuse: %+v %+v", res, refs)
	}
	if _, ok := ix.Lookup(churnHosts(7, MaxSlots)[MaxSlots-1].Addr); !ok {
		t.Error("reuse took more slots than the new hosts needed")
	}
}

// Capacity and clears ride the same write; an unchanged set writes nothing.
func TestSyncCapacityClearAndNoOp(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	ix := newTestIndex(t, st, clk, Config{})
	hosts := []SyncHost{{Addr: "10.0.0.1:80", CapacityTokens: 4096}, {Addr: "10.0.0.2:80", CapacityTokens: -1}}
	refs, res, err := ix.Sync(hosts, nil, freeIdle)
	if err != nil || !res.Wrote || res.Registered != 2 {
		t.Fatalf("first Sync: %+v %v", res, err)
	}
	if got := ix.table.recs[refs[0].Slot].capacity; got != ix.tokensToUnits(4096) {
		t.Errorf("capacity units %d, want %d", got, ix.tokensToUnits(4096))
	}
	writes := ix.Metrics().Writes
	if _, res, _ = ix.Sync(hosts, nil, freeIdle); res.Wrote || ix.Metrics().Writes != writes {
		t.Errorf("the same set again wrote the table: %+v", res)
	}
	c := chain(4, 16)
	ix.Record(refs[1], c, nil)
	hosts[1].Clear = true
	if _, res, _ = ix.Sync(hosts, nil, freeIdle); !res.Wrote {
		t.Fatal("a clear wrote nothing")
	}
	var m Matches
	ix.Query(c, &m)
	if m.Blocks[refs[1].Slot] != 0 {
		t.Errorf("after the clear the host matches %d blocks", m.Blocks[refs[1].Slot])
	}
	if r, ok := ix.Lookup("10.0.0.2:80"); !ok || r != refs[1] {
		t.Errorf("a clear moved the host: %+v %v", r, ok)
	}
}
