package router

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/scorer"
)

// fakeIndex is an exact prefix index: slot -> set of chain hashes held.
type fakeIndex struct {
	held    map[int]map[uint64]bool
	records int
}

func newFakeIndex() *fakeIndex { return &fakeIndex{held: map[int]map[uint64]bool{}} }

func (f *fakeIndex) Match(chain []uint64, slots []int, matched []int32) error {
	for i, s := range slots {
		n := 0
		for n < len(chain) && f.held[s][chain[n]] {
			n++
		}
		matched[i] = int32(n)
	}
	return nil
}

func (f *fakeIndex) Record(slot int, chain []uint64, held int) error {
	f.records++
	if f.held[slot] == nil {
		f.held[slot] = map[uint64]bool{}
	}
	for _, h := range chain {
		f.held[slot][h] = true
	}
	return nil
}

func hosts(n int) []scorer.Host {
	hs := make([]scorer.Host, n)
	for i := range hs {
		hs[i] = scorer.Host{Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Slot: i}
	}
	return hs
}

func chain(prefix uint64, n int) []uint64 {
	c := make([]uint64, n)
	for i := range c {
		c[i] = prefix<<20 | uint64(i+1)
	}
	return c
}

func mustHandler(t testing.TB, name string) *scorer.Handler {
	h, err := scorer.NewHandler(name)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestDecideRecordsAndFollowsPrefix(t *testing.T) {
	ix := newFakeIndex()
	r := New(Config{Handler: mustHandler(t, "kv_cache_aware"), Index: ix, Seed: 1})
	hs := hosts(4)
	in := &Input{PromptTokens: 1000, MaxTokens: 10, Chain: chain(7, 10)}
	t1, _ := r.Decide(in, hs)
	if t1.Host < 0 || ix.records != 1 {
		t.Fatalf("first decision: host %d, records %d", t1.Host, ix.records)
	}
	r.Release(&t1)
	// Same prompt again: the host that recorded it holds all 10 blocks.
	t2, res := r.Decide(in, hs)
	if t2.Host != t1.Host {
		t.Fatalf("repeat went to %d, first to %d: %s", t2.Host, t1.Host, res.Decode.Explain(&r.req, hs))
	}
	if t2.PredictedCachedTokens != 1000 {
		t.Fatalf("predicted cached = %d, want 1000", t2.PredictedCachedTokens)
	}
	r.Feedback(&t2, 992)
	r.Release(&t2)
	st := r.Stats()
	if st.Decisions != 2 || st.ConfirmedCachedTokens != 992 || st.OverPredicted != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Over many requests with random first-token and release orders (and
// releases without first token, as on a client reset), every counter
// returns to zero.
func TestLoadCountersReturnToZero(t *testing.T) {
	load := &MemLoad{}
	r := New(Config{Handler: mustHandler(t, "kv_cache_aware"), Index: newFakeIndex(), Load: load, Seed: 3})
	hs := hosts(8)
	rng := rand.New(rand.NewPCG(1, 2))
	var open []Ticket
	for i := 0; i < 5000; i++ {
		in := &Input{PromptTokens: 100 + rng.IntN(5000), MaxTokens: rng.IntN(500), Chain: chain(uint64(rng.IntN(20)), 1+rng.IntN(30))}
		tk, _ := r.Decide(in, hs)
		open = append(open, tk)
		for len(open) > 0 && rng.IntN(3) == 0 {
			k := rng.IntN(len(open))
			if rng.IntN(2) == 0 {
				r.FirstToken(&open[k])
			}
			r.Release(&open[k])
			r.Release(&open[k]) // idempotent
			open = append(open[:k], open[k+1:]...)
		}
	}
	busy := false
	for s := range hs {
		if load.Get(s) != (Load{}) {
			busy = true
		}
	}
	if !busy {
		t.Fatal("no load outstanding with requests open: accounting is not happening")
	}
	for k := range open {
		r.FirstToken(&open[k])
		r.Release(&open[k])
	}
	for s := range hs {
		if l := load.Get(s); l != (Load{}) {
			t.Fatalf("slot %d left with %+v", s, l)
		}
	}
}

func TestStickySessionPinsAndRepins(t *testing.T) {
	r := New(Config{Handler: mustHandler(t, "sticky_session"), Seed: 5})
	hs := hosts(4)
	in := &Input{SessionKey: "user-1", PromptTokens: 10}
	first, _ := r.Decide(in, hs)
	for i := 0; i < 20; i++ {
		// Other sessions in between advance the round robin.
		r.Decide(&Input{SessionKey: fmt.Sprintf("other-%d", i), PromptTokens: 10}, hs)
		tk, _ := r.Decide(in, hs)
		if tk.Host != first.Host {
			t.Fatalf("session moved from %d to %d", first.Host, tk.Host)
		}
	}
	hs[first.Host].BreakerOpen = true
	moved, _ := r.Decide(in, hs)
	if moved.Host == first.Host || moved.Host < 0 {
		t.Fatalf("pinned host is down but session stayed on %d", moved.Host)
	}
	hs[first.Host].BreakerOpen = false // it comes back: the session stays re-pinned
	again, _ := r.Decide(in, hs)
	if again.Host != moved.Host {
		t.Fatalf("re-pinned session went from %d to %d", moved.Host, again.Host)
	}
}

func TestDisaggregatedDecisionAccountsBothHosts(t *testing.T) {
	cfg, err := scorer.ParseConfig([]byte(`{"strategy": "kv_cache_aware", "disaggregation": {"threshold": 100}}`))
	if err != nil {
		t.Fatal(err)
	}
	h, _, err := cfg.Build()
	if err != nil {
		t.Fatal(err)
	}
	load := &MemLoad{}
	r := New(Config{Handler: h, Index: newFakeIndex(), Load: load, Seed: 1})
	hs := hosts(4)
	hs[0].Role, hs[1].Role = scorer.RolePrefill, scorer.RolePrefill
	hs[2].Role, hs[3].Role = scorer.RoleDecode, scorer.RoleDecode
	tk, res := r.Decide(&Input{PromptTokens: 4000, MaxTokens: 50, Chain: chain(1, 8)}, hs)
	if !res.Disaggregated || tk.Prefill > 1 || tk.Prefill < 0 || tk.Host < 2 {
		t.Fatalf("prefill %d decode %d disaggregated %v", tk.Prefill, tk.Host, res.Disaggregated)
	}
	if l := load.Get(tk.PrefillSlot); l.PrefillTokens != 4000 || l.InFlight != 1 {
		t.Fatalf("prefill host load %+v", l)
	}
	if l := load.Get(tk.Slot); l.DecodeTokens != 50 || l.PrefillTokens != 0 {
		t.Fatalf("decode host load %+v", l)
	}
	r.FirstToken(&tk)
	if l := load.Get(tk.PrefillSlot); l != (Load{}) {
		t.Fatalf("prefill host still loaded after first token: %+v", l)
	}
	r.Release(&tk)
	if l := load.Get(tk.Slot); l != (Load{}) {
		t.Fatalf("decode host still loaded after release: %+v", l)
	}
}
