package dispatch

import (
	"math"
	"testing"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scorer"
)

// The fit recovers a host's base delay and per-token time from samples
// whose work varies, and a rate through the origin from samples that do
// not.
func TestTTFTModelFit(t *testing.T) {
	var r ttftRecord
	if _, _, ok := r.model(); ok {
		t.Fatal("a model with no samples")
	}
	for i := range 40 {
		w := float64(500 + 250*(i%7))
		r.add(w, 40+0.1*w) // 40 ms base, 10k tokens/s
	}
	base, per, ok := r.model()
	if !ok || math.Abs(base-40) > 0.5 || math.Abs(per-0.1) > 0.001 {
		t.Errorf("fit: base %.2f ms, %.4f ms/token (ok %v), want 40, 0.1", base, per, ok)
	}
	var flat ttftRecord
	for range 10 {
		flat.add(1000, 200)
	}
	if base, per, ok := flat.model(); !ok || base != 0 || math.Abs(per-0.2) > 1e-9 {
		t.Errorf("constant work: base %v, %v ms/token, want 0, 0.2", base, per)
	}
}

func ttftHandler(t *testing.T) *scorer.Handler {
	t.Helper()
	return buildHandler(t, `{"strategy": "p", "profiles": {"p": {
		"filters": ["healthy"], "scorers": [{"plugin": "predicted_ttft", "weight": 1}], "picker": "max_score"}}}`)
}

// Two workers of one gateway (two Dispatchers over one shared store) learn
// one set of models: what one saw, the other scores with. A slot given to
// another host starts afresh, and a host not learned yet gets the mean of
// the others'.
func TestTTFTModelsSharedByWorkers(t *testing.T) {
	shared := &index.MemStore{}
	ix, err := index.New(shared, index.Config{Shards: 64, Now: func() int64 { return 1 << 30 }})
	if err != nil {
		t.Fatal(err)
	}
	h := ttftHandler(t)
	w1 := New(Config{Handler: h, Index: ix, Shared: shared, Seed: 1})
	w2 := New(Config{Handler: h, Index: ix, Shared: shared, Seed: 2})
	hosts := registered(t, w1, 3)
	// Worker 1 serves every request; host 0 answers in 0.1 ms per token,
	// host 1 in 0.4 (host 2 is never chosen: unlearned).
	for i := range 60 {
		in := &Input{PromptTokens: 400 + 100*(i%5), MaxTokens: 1}
		hs := append([]scorer.Host(nil), hosts[:2]...)
		tk, _ := w1.Decide(in, hs)
		per := 0.1
		if tk.Host == 1 {
			per = 0.4
		}
		tk.TTFTMs = per * float64(in.PromptTokens)
		w1.FirstToken(&tk)
		w1.Finish(&tk, 0)
	}
	hs := append([]scorer.Host(nil), hosts...)
	w2.ttft.fill(hs)
	if p0, p1 := hs[0].TTFTMsPerToken, hs[1].TTFTMsPerToken; math.Abs(p0-0.1) > 0.01 || math.Abs(p1-0.4) > 0.04 {
		t.Fatalf("worker 2 sees %.3f and %.3f ms/token, want 0.1 and 0.4 as worker 1 learned", p0, p1)
	}
	if got, want := hs[2].TTFTMsPerToken, (hs[0].TTFTMsPerToken+hs[1].TTFTMsPerToken)/2; math.Abs(got-want) > 1e-9 {
		t.Errorf("unlearned host 2: %.3f ms/token, want the mean %.3f", got, want)
	}
	// The slow host's slot goes to another engine: nothing is inherited.
	hs[1].Gen++
	w2.ttft.fill(hs)
	if hs[1].TTFTMsPerToken != hs[0].TTFTMsPerToken {
		t.Errorf("a new host in slot 1 inherited %.3f ms/token", hs[1].TTFTMsPerToken)
	}
	// And worker 2 now sends a request to the fast host.
	tk, _ := w2.Decide(&Input{PromptTokens: 800, MaxTokens: 1}, append([]scorer.Host(nil), hosts[:2]...))
	if tk.Host != 0 {
		t.Errorf("worker 2 chose host %d, want the fast host 0", tk.Host)
	}
}

// A profile without predicted_ttft learns nothing: no model, no shared key.
func TestTTFTNotLearnedWithoutTheScorer(t *testing.T) {
	shared := &index.MemStore{}
	r := New(Config{Handler: mustHandler(t, "kv_cache_aware"), Shared: shared, Seed: 1})
	hs := registered(t, r, 2)
	tk, _ := r.Decide(&Input{PromptTokens: 500, MaxTokens: 1}, hs)
	tk.TTFTMs = 50
	r.Finish(&tk, 0)
	if r.ttft != nil {
		t.Fatal("kv_cache_aware keeps TTFT models")
	}
	if _, _, err := shared.Get(ttftKey); err == nil {
		t.Error("kv_cache_aware wrote the TTFT models' key")
	}
}
