package index

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

func TestLoadCountersReturnToZeroWithRandomResets(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	ix := newTestIndex(t, st, clk, Config{})
	var refs []HostRef
	for i := 0; i < 8; i++ {
		r, _ := ix.Register(fmt.Sprintf("h%d:1", i))
		refs = append(refs, r)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var open []LoadTicket
	want := make([]Load, len(refs))
	for i := 0; i < 10000; i++ {
		r := refs[rng.IntN(len(refs))]
		p, d := rng.IntN(9000), rng.IntN(2000)
		tk, err := ix.AddLoadKV(r, p, d, p+d)
		if err != nil {
			t.Fatal(err)
		}
		want[r.Slot].KVTokens += uint32(p + d)
		want[r.Slot].InFlight++
		want[r.Slot].PrefillTokens += uint32(p)
		want[r.Slot].DecodeTokens += uint32(d)
		open = append(open, tk)
		// Finish some: normally (prefill done, then release), by reset
		// (release without prefill done), or both paths twice.
		for len(open) > 0 && rng.IntN(3) > 0 {
			k := rng.IntN(len(open))
			tk := &open[k]
			s := tk.Host().Slot
			if rng.IntN(2) == 0 {
				want[s].PrefillTokens -= tk.prefill
				ix.PrefillDone(tk)
				ix.PrefillDone(tk)
			}
			want[s].InFlight--
			want[s].PrefillTokens -= tk.prefill
			want[s].DecodeTokens -= tk.decode
			want[s].KVTokens -= tk.kv
			if err := ix.Release(tk); err != nil {
				t.Fatal(err)
			}
			if rng.IntN(4) == 0 { // a reset after the normal end
				ix.Release(tk)
				ix.PrefillDone(tk)
			}
			open[k] = open[len(open)-1]
			open = open[:len(open)-1]
		}
		if i%500 == 0 {
			ix.readSlots()
			got := ix.Loads(nil)
			for s := range want {
				if got[s] != want[s] {
					t.Fatalf("step %d slot %d: %+v, want %+v", i, s, got[s], want[s])
				}
			}
		}
	}
	for k := range open {
		ix.Release(&open[k])
	}
	for s, l := range ix.Loads(nil) {
		if l != (Load{}) {
			t.Fatalf("slot %d not back to zero: %+v", s, l)
		}
	}
}

func TestLoadNeverNegative(t *testing.T) {
	st := &MemStore{}
	clk := &fakeClock{ms: 1e6}
	ix := newTestIndex(t, st, clk, Config{})
	a, _ := ix.Register("a:1")
	// A ticket minted elsewhere (say another VM that lost its counts to a
	// corrupt value) releases more than is counted: counters stop at 0.
	big := LoadTicket{ref: a, inflight: 3, prefill: 100, decode: 100}
	small, _ := ix.AddLoad(a, 10, 10)
	ix.Release(&big)
	if l := ix.Loads(nil)[a.Slot]; l != (Load{}) {
		t.Fatalf("after over-release: %+v", l)
	}
	ix.Release(&small)
	if l := ix.Loads(nil)[a.Slot]; l != (Load{}) {
		t.Fatalf("went negative (wrapped): %+v", l)
	}
}

// TestConcurrentWorkers runs four VMs (goroutines, each its own Index) on
// one MemStore with Envoy's CAS rules: every Record that returned nil is
// visible afterwards (no lost updates; nothing is evicted here since no
// capacity is set and shards have room), and the load counters balance.
func TestConcurrentWorkers(t *testing.T) {
	st := &MemStore{}
	clk := &syncClock{}
	const workers, hosts, rounds = 4, 16, 300
	chains := make([][]uint64, 24)
	for i := range chains {
		chains[i] = chain(uint64(i+1)<<8, 20+i*3)
	}
	type rec struct {
		addr  string
		chain int
		n     int
	}
	done := make([][]rec, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			ix, err := New(st, Config{Shards: 64, ShardEntries: 256, Now: clk.now})
			if err != nil {
				t.Error(err)
				return
			}
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var m Matches
			for r := 0; r < rounds; r++ {
				addr := fmt.Sprintf("10.0.0.%d:80", rng.IntN(hosts))
				ref, err := ix.Register(addr)
				if err != nil {
					t.Error(err)
					return
				}
				k := rng.IntN(len(chains))
				c := chains[k][:1+rng.IntN(len(chains[k]))]
				if err := ix.Query(c, &m); err != nil {
					t.Error(err)
					return
				}
				tk, err := ix.AddLoad(ref, len(c)*64, 100)
				if err != nil {
					t.Error(err)
					return
				}
				if err := ix.Record(ref, c, &m); err == nil {
					done[w] = append(done[w], rec{addr, k, len(c)})
				}
				if err := ix.Release(&tk); err != nil {
					t.Error(err)
				}
				clk.tick()
			}
			if f := ix.Metrics().CASFailures; f != 0 {
				t.Errorf("worker %d: %d CAS failures", w, f)
			}
		}(w)
	}
	wg.Wait()
	ix, _ := New(st, Config{Shards: 64, ShardEntries: 256, Now: clk.now})
	var m Matches
	total := 0
	for _, recs := range done {
		for _, r := range recs {
			ref, ok := ix.Lookup(r.addr)
			if !ok {
				t.Fatalf("%s missing from the slot table", r.addr)
			}
			ix.Query(chains[r.chain][:r.n], &m)
			if m.Blocks[ref.Slot] != r.n {
				t.Fatalf("%s recorded %d blocks of chain %d, index shows %d", r.addr, r.n, r.chain, m.Blocks[ref.Slot])
			}
			total++
		}
	}
	if total < workers*rounds*9/10 {
		t.Fatalf("only %d of %d records succeeded", total, workers*rounds)
	}
	for s, l := range ix.Loads(nil) {
		if l != (Load{}) {
			t.Fatalf("slot %d load %+v after all releases", s, l)
		}
	}
	if n := ix.Slots(); n != hosts {
		t.Fatalf("%d slots for %d addresses registered concurrently", n, hosts)
	}
}

type syncClock struct {
	mu sync.Mutex
	ms int64
}

func (c *syncClock) now() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return 1e6 + c.ms
}

func (c *syncClock) tick() {
	c.mu.Lock()
	c.ms += 7
	c.mu.Unlock()
}
