package dispatch

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scorer"
)

func newIndex(t testing.TB) *index.Index {
	ix, err := index.New(&index.MemStore{}, index.Config{Shards: 1024, Now: func() int64 { return 1 << 30 }})
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

// registered returns n hosts registered with r.
func registered(t testing.TB, r *Dispatcher, n int) []scorer.Host {
	hs := make([]scorer.Host, n)
	for i := range hs {
		if err := r.Register(fmt.Sprintf("10.0.0.%d:8000", i+1), &hs[i]); err != nil {
			t.Fatal(err)
		}
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

// buildHandler is the handler of the plugin configuration config.
func buildHandler(t *testing.T, config string) *scorer.Handler {
	t.Helper()
	_, h, _, err := scorer.Load([]byte(config))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestDecideRecordsAndFollowsPrefix(t *testing.T) {
	ix := newIndex(t)
	r := New(Config{Handler: mustHandler(t, "kv_cache_aware"), Index: ix, Seed: 1})
	hs := registered(t, r, 4)
	in := &Input{PromptTokens: 1000, MaxTokens: 10, Chain: chain(7, 10)}
	t1, _ := r.Decide(in, hs)
	if t1.Host < 0 || ix.Metrics().Records != 1 {
		t.Fatalf("first decision: host %d, records %d", t1.Host, ix.Metrics().Records)
	}
	r.Release(&t1)
	// Same prompt again: the host that recorded it holds all 10 blocks.
	t2, res := r.Decide(in, hs)
	if t2.Host != t1.Host {
		t.Fatalf("repeat went to %d, first to %d: %s", t2.Host, t1.Host, res.Decode.Explain(&r.req, hs))
	}
	ex := string(r.AppendExplain(nil, &res, hs))
	if !strings.Contains(ex, "matched=10/10blk uncached=0tok") || !strings.Contains(ex, "host="+t1.Address) {
		t.Fatalf("explanation %q", ex)
	}
	if t2.PredictedCachedTokens != 1000 {
		t.Fatalf("predicted cached = %d, want 1000", t2.PredictedCachedTokens)
	}
	r.Feedback(&t2, 992)
	r.Release(&t2)
	st := r.Stats()
	if st.Decisions != 2 || st.ConfirmedCachedTokens != 992 || st.PredictedCachedTokens != 1000 || st.OverPredicted != 0 || st.IndexErrors != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Over many requests with random first-token and release orders (and
// releases without first token, as on a client reset), every counter
// returns to zero, in the index's shared counters and in the dispatcher's own.
func TestLoadCountersReturnToZero(t *testing.T) {
	for _, withIndex := range []bool{true, false} {
		t.Run(fmt.Sprintf("index=%v", withIndex), func(t *testing.T) {
			var ix *index.Index
			if withIndex {
				ix = newIndex(t)
			}
			r := New(Config{Handler: mustHandler(t, "kv_cache_aware"), Index: ix, Seed: 3})
			hs := registered(t, r, 8)
			rng := rand.New(rand.NewPCG(1, 2))
			var open []Ticket
			for i := 0; i < 3000; i++ {
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
			if busy := sumLoad(r, hs); busy.InFlight == 0 || busy.PendingDecodeTokens == 0 || busy.InFlightTokens == 0 {
				t.Fatalf("open requests but load %+v: accounting is not happening", busy)
			}
			for k := range open {
				r.FirstToken(&open[k])
				r.Release(&open[k])
			}
			if l := sumLoad(r, hs); !idle(l) {
				t.Fatalf("load left after every release: %+v", l)
			}
			if st := r.Stats(); st.LoadErrors != 0 {
				t.Fatalf("load errors: %d", st.LoadErrors)
			}
		})
	}
}

// sumLoad refreshes the hosts' load fields (through a decision with no
// chain, whose own load it then releases) and sums them.
func sumLoad(r *Dispatcher, hs []scorer.Host) scorer.Host {
	tk, _ := r.Decide(&Input{}, hs)
	var s scorer.Host
	for _, h := range hs {
		s.InFlight += h.InFlight
		s.PendingPrefillTokens += h.PendingPrefillTokens
		s.PendingDecodeTokens += h.PendingDecodeTokens
		s.InFlightTokens += h.InFlightTokens
	}
	r.Release(&tk)
	return s
}

func TestStickySessionPinsAndRepins(t *testing.T) {
	r := New(Config{Handler: mustHandler(t, "sticky_session"), Seed: 5})
	hs := registered(t, r, 4)
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
	h := buildHandler(t, `{"strategy": "kv_cache_aware", "disaggregation": {"threshold": 100}}`)
	r := New(Config{Handler: h, Index: newIndex(t), Seed: 1})
	hs := registered(t, r, 4)
	hs[0].Role, hs[1].Role = scorer.RolePrefill, scorer.RolePrefill
	hs[2].Role, hs[3].Role = scorer.RoleDecode, scorer.RoleDecode
	tk, res := r.Decide(&Input{PromptTokens: 4000, MaxTokens: 50, Chain: chain(1, 8)}, hs)
	if !res.Disaggregated || tk.Prefill > 1 || tk.Prefill < 0 || tk.Host < 2 {
		t.Fatalf("prefill %d decode %d disaggregated %v", tk.Prefill, tk.Host, res.Disaggregated)
	}
	pre, dec := tk.Prefill, tk.Host
	sumLoad(r, hs)
	if l := hs[pre]; l.PendingPrefillTokens != 4000 || l.InFlight != 1 {
		t.Fatalf("prefill host load %+v", l)
	}
	if l := hs[dec]; l.PendingDecodeTokens != 50 || l.PendingPrefillTokens != 0 || l.InFlight != 1 {
		t.Fatalf("decode host load %+v", l)
	}
	r.FirstToken(&tk)
	sumLoad(r, hs)
	if l := hs[pre]; l.InFlight != 0 || l.PendingPrefillTokens != 0 || l.InFlightTokens != 0 {
		t.Fatalf("prefill host still loaded after first token: %+v", l)
	}
	r.Release(&tk)
	if l := sumLoad(r, hs); !idle(l) {
		t.Fatalf("load left after release: %+v", l)
	}
}

func idle(h scorer.Host) bool {
	return h.InFlight == 0 && h.PendingPrefillTokens == 0 && h.PendingDecodeTokens == 0 && h.InFlightTokens == 0
}

// Registering an address twice gives the same slot, with or without an
// index, so a re-pushed endpoint list does not split a host's counters.
func TestRegisterIsIdempotent(t *testing.T) {
	for _, ix := range []*index.Index{nil, newIndex(t)} {
		r := New(Config{Handler: mustHandler(t, "round_robin"), Index: ix})
		var a, b, c scorer.Host
		if err := r.Register("10.0.0.1:80", &a); err != nil {
			t.Fatal(err)
		}
		r.Register("10.0.0.2:80", &b)
		r.Register("10.0.0.1:80", &c)
		if a.Slot != c.Slot || a.Slot == b.Slot || c.Address != "10.0.0.1:80" {
			t.Fatalf("index=%v: slots %d %d %d", ix != nil, a.Slot, b.Slot, c.Slot)
		}
	}
}

// Without sessions and with the index forgetting everything (no index at
// all here), kv_cache_aware still sends a prefix group back to the host
// that served it: the dispatcher's prefix memory.
func TestPrefixMemory(t *testing.T) {
	r := New(Config{Handler: mustHandler(t, "kv_cache_aware"), Seed: 9})
	hs := registered(t, r, 8)
	first, _ := r.Decide(&Input{PromptTokens: 2000, Chain: chain(42, 12)}, hs)
	r.Release(&first)
	for i := 0; i < 20; i++ {
		// Unrelated traffic in between.
		o, _ := r.Decide(&Input{PromptTokens: 2000, Chain: chain(uint64(100+i), 12)}, hs)
		r.Release(&o)
		// Same first blocks, different tail: the same group.
		c := chain(42, 12)
		c[11] = uint64(9000 + i)
		tk, res := r.Decide(&Input{PromptTokens: 2000, Chain: c}, hs)
		if tk.Host != first.Host {
			t.Fatalf("group moved from %d to %d: %s", first.Host, tk.Host, r.AppendExplain(nil, &res, hs))
		}
		r.Release(&tk)
	}
}

// trustHandler is a prefix-affinity profile with trustFeedback on.
func trustHandler(t *testing.T) *scorer.Handler {
	t.Helper()
	return buildHandler(t, `{"strategy": "p", "profiles": {"p": {"trustFeedback": true,
		"scorers": [{"plugin": "prefix_cache", "weight": 1}, {"plugin": "least_request", "weight": 0.01}]}}}`)
}

// With trustFeedback, a host whose predictions the engine keeps denying
// has its predicted matches discounted.
func TestTrustFeedbackDiscountsOverPredictingHosts(t *testing.T) {
	r := New(Config{Handler: trustHandler(t), Index: newIndex(t), Seed: 1})
	hs := registered(t, r, 2)
	in := &Input{PromptTokens: 1000, Chain: chain(5, 10)}
	t0, _ := r.Decide(in, hs)
	r.Release(&t0)
	for i := 0; i < 30; i++ {
		tk, _ := r.Decide(in, hs)
		if i == 0 && tk.PredictedCachedTokens != 1000 {
			t.Fatalf("first repeat predicted %d, want 1000", tk.PredictedCachedTokens)
		}
		r.Feedback(&tk, 100) // the engine only ever had a tenth
		r.Release(&tk)
	}
	tk, _ := r.Decide(in, hs)
	if tk.Host == t0.Host && tk.PredictedCachedTokens > 300 {
		t.Fatalf("predicted %d cached tokens after 30 denials", tk.PredictedCachedTokens)
	}
	r.Release(&tk)
}

// A slot given to a new host (the old one left the candidate set) does
// not carry the old host's learned trust: ForgetSlot drops it.
func TestForgetSlotDropsTheOldHostsTrust(t *testing.T) {
	ix := newIndex(t)
	r := New(Config{Handler: trustHandler(t), Index: ix, Seed: 1})
	old := registered(t, r, 1)
	in := &Input{PromptTokens: 1000, Chain: chain(6, 10)}
	for i := 0; i < 31; i++ {
		tk, _ := r.Decide(in, old)
		r.Feedback(&tk, 100) // the engine only ever had a tenth
		r.Release(&tk)
	}
	if err := ix.Remove(old[0].Address); err != nil {
		t.Fatal(err)
	}
	next := make([]scorer.Host, 1)
	if err := r.Register("10.0.9.1:8000", &next[0]); err != nil || next[0].Slot != old[0].Slot {
		t.Fatalf("the new host got slot %d (%v), want the freed %d", next[0].Slot, err, old[0].Slot)
	}
	r.ForgetSlot(next[0].Slot)
	t0, _ := r.Decide(in, next)
	r.Release(&t0)
	tk, _ := r.Decide(in, next)
	r.Release(&tk)
	if tk.PredictedCachedTokens != 1000 {
		t.Errorf("the new host's prediction is %d, want 1000: it inherited the old host's trust", tk.PredictedCachedTokens)
	}
}

func TestPrefixMemoryTable(t *testing.T) {
	var m prefixMemory
	turn1 := chain(7, 20)
	m.store(turn1, "a:1")
	turn2 := append(chain(7, 20), chain(8, 30)...) // turn 1 then more
	if got := m.lookup(turn2); got != "a:1" {
		t.Fatalf("turn 2 found %q, want a:1", got)
	}
	if got := m.lookup(chain(7, 5)); got != "" {
		t.Fatalf("a 5-block chain is below the minimum depth, found %q", got)
	}
	if got := m.lookup(chain(9, 40)); got != "" {
		t.Fatalf("an unrelated chain found %q", got)
	}
	m.store(turn2, "b:2") // the group moved: the deepest key wins
	if got := m.lookup(append(turn2, 1, 2, 3)); got != "b:2" {
		t.Fatalf("found %q, want b:2", got)
	}
	if testing.AllocsPerRun(100, func() { m.store(turn2, "b:2"); m.lookup(turn2) }) != 0 {
		t.Fatal("prefix memory allocates")
	}
}

// The request the profile sees is rebuilt whole for each decision, on a
// fleet that grows and shrinks: one entry per host, matches only on hosts
// that recorded the prompt, no session pin or field left from the last one.
func TestDecideRebuildsRequest(t *testing.T) {
	ix := newIndex(t)
	r := New(Config{Handler: mustHandler(t, "kv_cache_aware"), Index: ix, Seed: 1})
	hs := registered(t, r, 6)
	holds := map[string]bool{} // hosts that recorded chain 3
	warm := &Input{Model: "m", SessionKey: "s1", PromptTokens: 1000, Chain: chain(3, 10)}
	tk, _ := r.Decide(warm, hs[:2])
	r.Release(&tk)
	holds[tk.Address] = true
	for _, n := range []int{2, 6, 1, 4} {
		in := &Input{PromptTokens: 500, Chain: chain(3, 5), PrefixBlocks: 2}
		tk, _ := r.Decide(in, hs[:n])
		r.Release(&tk)
		req := &r.req
		if len(req.MatchedBlocks) != n || len(req.MatchedTokens) != n {
			t.Fatalf("%d hosts: %d and %d matches", n, len(req.MatchedBlocks), len(req.MatchedTokens))
		}
		for i := range n {
			if b := req.MatchedBlocks[i]; !holds[hs[i].Address] && b != 0 {
				t.Fatalf("%d hosts: host %d matches %d blocks, holds none", n, i, b)
			}
		}
		holds[tk.Address] = true
		if req.Model != "" || req.SessionKey != "" || req.PinnedAddress != "" || req.PromptTokens != 500 ||
			req.TotalBlocks != 5 || req.PrefixHash != in.Chain[1] {
			t.Fatalf("%d hosts: request %+v", n, req)
		}
	}
}

// Finish(t, cached) is Feedback(t, cached) then Release(t), and a negative
// count is no feedback: two dispatchers fed the same requests, one ending them
// with Finish and one with Feedback and Release, keep the same decisions,
// stats and load (trust feedback on, so feedback steers later decisions).
func TestFinishIsFeedbackThenRelease(t *testing.T) {
	h := buildHandler(t, `{"strategy": "p", "profiles": {"p": {"trustFeedback": true,
		"scorers": [{"plugin": "prefix_cache", "weight": 1}, {"plugin": "least_request", "weight": 0.1}]}}}`)
	var rs [2]*Dispatcher
	var hss [2][]scorer.Host
	for k := range rs {
		rs[k] = New(Config{Handler: h, Index: newIndex(t), Seed: 7})
		hss[k] = registered(t, rs[k], 6)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 2000; i++ {
		in := &Input{PromptTokens: 100 + rng.IntN(4000), MaxTokens: rng.IntN(300), Chain: chain(uint64(rng.IntN(10)), 1+rng.IntN(20))}
		cached := rng.IntN(4000) - 500 // about one in nine without feedback
		var tks [2]Ticket
		for k, r := range rs {
			tks[k], _ = r.Decide(in, hss[k])
		}
		if tks[0].Host != tks[1].Host || tks[0].PredictedCachedTokens != tks[1].PredictedCachedTokens {
			t.Fatalf("request %d: decisions differ: %+v vs %+v", i, tks[0], tks[1])
		}
		rs[0].Finish(&tks[0], cached)
		rs[0].Finish(&tks[0], -1) // idempotent release
		rs[1].Feedback(&tks[1], cached)
		rs[1].Release(&tks[1])
	}
	if a, b := rs[0].Stats(), rs[1].Stats(); a != b || a.FeedbackRequests == 0 || a.FeedbackRequests == a.Decisions {
		t.Fatalf("stats differ or feedback not exercised:\n%+v\n%+v", a, b)
	}
	for k := range rs {
		if l := sumLoad(rs[k], hss[k]); !idle(l) {
			t.Fatalf("dispatcher %d: load left after every request ended: %+v", k, l)
		}
	}
}

// TestPredictionErrorDoesNotCancel: an over-prediction on one request and
// an under-prediction on another add up in the block-weighted error, where
// the totals alone would show none.
func TestPredictionErrorDoesNotCancel(t *testing.T) {
	ix := newIndex(t)
	r := New(Config{Handler: mustHandler(t, "kv_cache_aware"), Index: ix, Seed: 1})
	hs := registered(t, r, 2)
	a := &Input{PromptTokens: 1000, MaxTokens: 10, Chain: chain(7, 10)}
	t1, _ := r.Decide(a, hs)
	r.Finish(&t1, -1) // no feedback: counts nowhere
	t2, _ := r.Decide(a, hs)
	if t2.PredictedCachedTokens != 1000 {
		t.Fatalf("predicted %d, want 1000", t2.PredictedCachedTokens)
	}
	r.Finish(&t2, 600) // over by 400
	b := &Input{PromptTokens: 1000, MaxTokens: 10, Chain: chain(9, 10)}
	t3, _ := r.Decide(b, hs)
	r.Finish(&t3, 400) // predicted 0: under by 400
	st := r.Stats()
	if st.PredictedCachedTokens != 1000 || st.ConfirmedCachedTokens != 1000 || st.PredictionErrorTokens != 800 {
		t.Fatalf("stats %+v", st)
	}
	if got := st.PredictionError(); got != 0.8 {
		t.Errorf("PredictionError = %v, want 0.8", got)
	}
	if (Stats{}).PredictionError() != 0 || (Stats{PredictionErrorTokens: 5}).PredictionError() != 1 {
		t.Error("PredictionError without confirmed tokens")
	}
}

// TestFeedbackCorrectsTheIndex: a host that confirms none of a predicted
// prefix had evicted it, and under LRU everything it last used earlier
// too: that older chain stops counting (unless NoCorrect), while the
// request's own chain, just computed, stays.
func TestFeedbackCorrectsTheIndex(t *testing.T) {
	for _, noCorrect := range []bool{false, true} {
		now := int64(1 << 30)
		ix, err := index.New(&index.MemStore{}, index.Config{Shards: 1024, Now: func() int64 { return now }})
		if err != nil {
			t.Fatal(err)
		}
		r := New(Config{Handler: mustHandler(t, "kv_cache_aware"), Index: ix, Seed: 1, NoCorrect: noCorrect})
		hs := registered(t, r, 1)
		in := func(p uint64) *Input { return &Input{PromptTokens: 640, MaxTokens: 1, Chain: chain(p, 10)} }
		serve := func(p uint64, cached int) Ticket {
			tk, _ := r.Decide(in(p), hs)
			r.Finish(&tk, cached)
			now += 3000 // past a usage bucket and the touch interval
			return tk
		}
		serve(1, 0)                                             // C: oldest
		serve(2, 0)                                             // A
		serve(3, 0)                                             // B
		if tk := serve(2, 0); tk.PredictedCachedTokens != 640 { // A again: the engine had evicted it
			t.Fatalf("A predicted %d, want 640", tk.PredictedCachedTokens)
		}
		c := serve(1, 0)
		if noCorrect && c.PredictedCachedTokens != 640 {
			t.Errorf("NoCorrect: C predicted %d, want 640 (uncorrected)", c.PredictedCachedTokens)
		}
		if !noCorrect && c.PredictedCachedTokens != 0 {
			t.Errorf("C predicted %d after the engine showed it evicted newer blocks, want 0", c.PredictedCachedTokens)
		}
		if b := serve(3, 640); b.PredictedCachedTokens != 640 {
			t.Errorf("noCorrect=%v: B (newer than A's stamp) predicted %d, want 640", noCorrect, b.PredictedCachedTokens)
		}
	}
}

// TestCalibratesCharsPerTokenPerModel: an engine whose tokenizer makes 6.2
// characters of a token (the index assumes 4) reports prompt_tokens; the
// dispatcher learns it for that model, and its predictions and prompt counts
// for that model shrink to the engine's tokens, while another model's do
// not.
func TestCalibratesCharsPerTokenPerModel(t *testing.T) {
	ix := newIndex(t)
	r := New(Config{Handler: mustHandler(t, "kv_cache_aware"), Index: ix, Seed: 1})
	hs := registered(t, r, 1)
	in := func(model string, p uint64) *Input {
		return &Input{Model: model, PromptTokens: 1000, PromptChars: 4000, MaxTokens: 1, Chain: chain(p, 10)}
	}
	t1, _ := r.Decide(in("m", 1), hs)
	t1.EnginePromptTokens = 645 // 4000 / 6.2
	r.Finish(&t1, 0)
	if got := r.CharsPerToken("m"); got < 6.19 || got > 6.21 {
		t.Fatalf("learned %.2f characters per token, want 6.2", got)
	}
	if got := r.CharsPerToken("other"); got != 4 {
		t.Errorf("an unseen model: %.2f, want the index's 4", got)
	}
	x := in("m", 1)
	t2, _ := r.Decide(x, hs)
	if t2.PredictedCachedTokens != 645 || x.PromptTokens != 645 {
		t.Errorf("calibrated model: predicted %d of %d prompt tokens, want 645 of 645", t2.PredictedCachedTokens, x.PromptTokens)
	}
	r.Finish(&t2, 645)
	t3, _ := r.Decide(in("n", 1), hs) // same prompt hashes, another model's name: not calibrated
	if t3.PredictedCachedTokens != 1000 {
		t.Errorf("uncalibrated model: predicted %d, want 1000", t3.PredictedCachedTokens)
	}
	if st := r.Stats(); st.OverPredicted != 0 {
		t.Errorf("the calibrated prediction was counted over-predicted: %+v", st)
	}
}
