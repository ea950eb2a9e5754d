package scorer

import (
	"math"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/config"
)

func handler(t testing.TB, name string) *Handler {
	t.Helper()
	h, err := NewHandler(name)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestRoundRobinIsEven(t *testing.T) {
	h := handler(t, "round_robin")
	hosts := fleet(8)
	s := NewScratch(1)
	count := make([]int, 8)
	for i := 0; i < 8000; i++ {
		count[h.Run(newReq(8, 10, 1), hosts, s).Decode.Primary()]++
	}
	for i, n := range count {
		if n != 1000 {
			t.Fatalf("host %d got %d of 8000: %v", i, n, count)
		}
	}
}

// A hot prefix under prefix_hash fills its first-choice host up to the
// bound, then spills, so no host exceeds ceil(c x mean) in flight.
func TestPrefixHashSpillsUnderAHotPrefix(t *testing.T) {
	h := handler(t, "prefix_hash")
	hosts := fleet(8)
	s := NewScratch(1)
	first := -1
	spills := 0
	for i := 0; i < 800; i++ {
		req := newReq(8, 1000, 10)
		req.PrefixHash = 0xfeed
		d := h.Run(req, hosts, s).Decode
		p := d.Primary()
		if i == 0 {
			first = p
		} else if p != first && strings.HasPrefix(d.Note, "spill") {
			spills++
		}
		hosts[p].InFlight++ // nothing finishes: the hot prefix piles up
		total := 0
		max := 0
		for _, x := range hosts {
			total += x.InFlight
			max = int(math.Max(float64(max), float64(x.InFlight)))
		}
		if bound := int(math.Ceil(1.25 * float64(total) / 8)); max > bound {
			t.Fatalf("after %d requests a host holds %d > bound %d", i+1, max, bound)
		}
	}
	if hosts[first].InFlight < 100 || spills == 0 {
		t.Fatalf("first choice holds %d, %d spills: affinity or spill-over missing", hosts[first].InFlight, spills)
	}
}

// Without load, prefix_hash is consistent: a key keeps its host, keys spread
// over hosts, and removing a host moves only the keys it held.
func TestPrefixHashIsConsistent(t *testing.T) {
	h := handler(t, "prefix_hash")
	hosts := fleet(8)
	s := NewScratch(1)
	owner := map[uint64]int{}
	count := make([]int, 8)
	for k := uint64(1); k <= 4000; k++ {
		req := newReq(8, 100, 4)
		req.PrefixHash = k * 0x9e3779b97f4a7c15
		p := h.Run(req, hosts, s).Decode.Primary()
		owner[k] = p
		count[p]++
	}
	for _, n := range count {
		if n < 350 || n > 650 {
			t.Fatalf("keys per host %v: not spread", count)
		}
	}
	hosts[3].BreakerOpen = true
	moved := 0
	for k, was := range owner {
		req := newReq(8, 100, 4)
		req.PrefixHash = k * 0x9e3779b97f4a7c15
		p := h.Run(req, hosts, s).Decode.Primary()
		if p != was {
			moved++
			if was != 3 {
				t.Fatalf("key %d moved from healthy host %d to %d", k, was, p)
			}
		}
	}
	if moved != count[3] {
		t.Fatalf("moved %d keys, host 3 held %d", moved, count[3])
	}
}

func TestKVCacheAwareFollowsAffinity(t *testing.T) {
	h := handler(t, "kv_cache_aware")
	hosts := fleet(4)
	req := newReq(4, 8000, 16)
	req.MatchedBlocks = []int32{0, 12, 0, 4}
	req.MatchedTokens = []int32{0, 6000, 0, 2000}
	// Some load everywhere, a little more on the warm host.
	for i := range hosts {
		hosts[i].PendingPrefillTokens = 2000
	}
	hosts[1].PendingPrefillTokens = 4000
	d := h.Run(req, hosts, NewScratch(1)).Decode
	if d.Primary() != 1 {
		t.Fatalf("chose %d: %s", d.Primary(), d.Explain(req, hosts))
	}
	if d.Order[1] != 3 {
		t.Fatalf("first fallback %d, want the next-warmest host 3: %s", d.Order[1], d.Explain(req, hosts))
	}
}

// The warm host is skipped once its token load passes the imbalance bound,
// and the decision says so.
func TestKVCacheAwareAffinityYieldsToImbalanceBound(t *testing.T) {
	h := handler(t, "kv_cache_aware")
	hosts := fleet(4)
	req := newReq(4, 8000, 16)
	req.MatchedBlocks = []int32{16, 0, 0, 0}
	req.MatchedTokens = []int32{8000, 0, 0, 0}
	warm := -1
	// Pile load on host 0 until affinity gives way.
	for load := int64(0); load <= 200000; load += 4000 {
		hosts[0].PendingPrefillTokens = load
		d := h.Run(req, hosts, NewScratch(1)).Decode
		if d.Primary() != 0 {
			warm = int(load)
			if d.Note != "imbalance guard" && load > 32768 {
				t.Fatalf("left the warm host at %d tokens without the guard: %s", load, d.Explain(req, hosts))
			}
			break
		}
	}
	if warm < 0 {
		t.Fatal("affinity never yielded")
	}
	// The guard's absolute slack is 32768 tokens: affinity must hold at
	// least until the warm host is a full prompt (8000 tokens) busier.
	t.Logf("affinity yielded at %d pending tokens", warm)
	if warm < 8000 || warm > 32768+4000 {
		t.Fatalf("affinity yielded at %d pending tokens", warm)
	}
}

func TestSGLangEmulation(t *testing.T) {
	h := handler(t, "sglang_cache_aware")
	t.Run("balanced: best match above threshold", func(t *testing.T) {
		hosts := fleet(3)
		req := newReq(3, 1000, 10)
		req.MatchedTokens = []int32{100, 400, 0}
		if p := h.Run(req, hosts, NewScratch(1)).Decode.Primary(); p != 1 {
			t.Fatalf("chose %d", p)
		}
	})
	t.Run("balanced: below threshold goes to the smallest tree", func(t *testing.T) {
		hosts := fleet(3)
		hosts[0].IndexedBlocks, hosts[1].IndexedBlocks, hosts[2].IndexedBlocks = 500, 900, 100
		req := newReq(3, 1000, 10)
		req.MatchedTokens = []int32{300, 0, 0} // 0.3 is not above 0.3
		d := h.Run(req, hosts, NewScratch(1)).Decode
		if d.Primary() != 2 || d.Note != "low match: smallest tree" {
			t.Fatalf("chose %d (%s)", d.Primary(), d.Note)
		}
	})
	t.Run("imbalanced: shortest queue wins over the match", func(t *testing.T) {
		hosts := fleet(3)
		hosts[0].InFlight, hosts[1].InFlight, hosts[2].InFlight = 200, 100, 120
		req := newReq(3, 1000, 10)
		req.MatchedTokens = []int32{1000, 0, 0}
		d := h.Run(req, hosts, NewScratch(1)).Decode
		if d.Primary() != 1 {
			t.Fatalf("chose %d (%s)", d.Primary(), d.Note)
		}
	})
	t.Run("needs both thresholds to call it imbalanced", func(t *testing.T) {
		hosts := fleet(2)
		hosts[0].InFlight, hosts[1].InFlight = 300, 230 // diff 70 > 64 but 300 < 1.5 x 230
		req := newReq(2, 1000, 10)
		req.MatchedTokens = []int32{1000, 0}
		if p := h.Run(req, hosts, NewScratch(1)).Decode.Primary(); p != 0 {
			t.Fatalf("chose %d", p)
		}
	})
}

func TestDynamoEmulation(t *testing.T) {
	h := handler(t, "dynamo_kv")
	hosts := fleet(3)
	req := newReq(3, 4000, 8)
	req.MaxTokens = 100
	req.MatchedTokens = []int32{4000, 2000, 0}
	hosts[0].InFlightTokens = 5000 // cost 0 + 5000
	hosts[1].InFlightTokens = 1000 // cost 2000 + 1000: lowest
	hosts[2].InFlightTokens = 0    // cost 4000
	d := h.Run(req, hosts, NewScratch(1)).Decode
	if d.Primary() != 1 || d.Order[1] != 2 || d.Order[2] != 0 {
		t.Fatalf("order %v", d.Order)
	}
}

func TestGIEEmulation(t *testing.T) {
	h := handler(t, "gie_default")
	hosts := fleet(3)
	req := newReq(3, 4000, 10)
	req.MatchedBlocks = []int32{10, 0, 0}
	hosts[0].Waiting, hosts[1].Waiting, hosts[2].Waiting = 4, 0, 2
	hosts[0].KVUsage, hosts[1].KVUsage, hosts[2].KVUsage = 0.5, 0.5, 0.5
	// host 0: (3*1 + 2*0 + 2*0.5)/7 = 4/7; host 1: (0 + 2 + 1)/7 = 3/7.
	d := h.Run(req, hosts, NewScratch(1)).Decode
	if d.Primary() != 0 || math.Abs(d.Total[0]-4.0/7) > 1e-9 || math.Abs(d.Total[1]-3.0/7) > 1e-9 {
		t.Fatalf("primary %d totals %v", d.Primary(), d.Total)
	}
}

func TestDisaggregationThreshold(t *testing.T) {
	cfg, err := config.Parse([]byte(`{"disaggregation": {"threshold": 1000}}`))
	if err != nil {
		t.Fatal(err)
	}
	h, _, err := Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hosts := fleet(4)
	hosts[0].Role, hosts[1].Role, hosts[2].Role, hosts[3].Role = RolePrefill, RolePrefill, RoleDecode, RoleDecode
	s := NewScratch(1)
	short := newReq(4, 900, 4)
	if r := h.Run(short, hosts, s); r.Disaggregated || r.Decode.Primary() < 2 {
		t.Fatalf("short prompt: disaggregated=%v decode=%d", r.Disaggregated, r.Decode.Primary())
	}
	long := newReq(4, 5000, 20)
	r := h.Run(long, hosts, s)
	if !r.Disaggregated || r.Decode.Primary() < 2 || r.Prefill.Primary() > 1 {
		t.Fatalf("long prompt: disaggregated=%v decode=%d prefill=%d", r.Disaggregated, r.Decode.Primary(), r.Prefill.Primary())
	}
	// Mostly cached on the decode hosts: no transfer needed.
	cached := newReq(4, 5000, 20)
	cached.MatchedBlocks = []int32{0, 0, 19, 19}
	cached.MatchedTokens = []int32{0, 0, 4500, 4500}
	if r := h.Run(cached, hosts, s); r.Disaggregated {
		t.Fatal("disaggregated although only 500 tokens are uncached")
	}
	if ex := r.Explain(long, hosts); !strings.Contains(ex, " | prefill: profile=kv_cache_aware host=10.0.0.") {
		t.Fatalf("explanation %q", ex)
	}
}

func TestExplanation(t *testing.T) {
	h := handler(t, "kv_cache_aware")
	hosts := fleet(3)
	req := newReq(3, 8000, 16)
	req.MatchedBlocks = []int32{0, 12, 0}
	req.MatchedTokens = []int32{0, 6000, 0}
	d := h.Run(req, hosts, NewScratch(1)).Decode
	got := d.Explain(req, hosts)
	for _, want := range []string{"profile=kv_cache_aware", "host=10.0.0.2:8000", "prefix=0.732x3", "cost=1.000x3", "session_affinity=0.000x1.5",
		"matched=12/16blk", "uncached=2000tok", "fallbacks=10.0.0.", "candidates=3/3"} {
		if !strings.Contains(got, want) {
			t.Fatalf("explanation %q lacks %q", got, want)
		}
	}
	none := handler(t, "round_robin").Run(newReq(0, 1, 1), nil, NewScratch(1)).Decode
	if none.Primary() != -1 || !strings.Contains(none.Explain(nil, nil), "host=none candidates=0/0") {
		t.Fatalf("no-host explanation %q", none.Explain(nil, nil))
	}
}

// A scorer that misbehaves (NaN, out of range) cannot steer traffic.
type wildScorer struct{}

func (wildScorer) Type() string       { return "test_wild" }
func (wildScorer) Category() Category { return Distribution }
func (wildScorer) Score(c *Cycle, cand []int, out []float64) {
	for _, h := range cand {
		out[h] = []float64{math.NaN(), 7, -3, 0.5}[h%4]
	}
}

func init() {
	Register("test_wild", KindScorer, "test only", func(*config.Params) Plugin { return wildScorer{} })
}

func TestScoresAreClamped(t *testing.T) {
	cfg, _ := config.Parse([]byte(`{"strategy": "p", "profiles": {"p": {"scorers": ["test_wild"]}}}`))
	h, _, err := Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := h.Run(newReq(4, 1, 1), fleet(4), NewScratch(1)).Decode
	want := []float64{0, 1, 0, 0.5}
	for i, w := range want {
		if d.Total[i] != w {
			t.Fatalf("totals %v, want %v", d.Total, want)
		}
	}
	if d.Primary() != 1 {
		t.Fatalf("primary %d", d.Primary())
	}
}

// Inconsistent per-candidate slices (shorter than hosts) read as zero
// instead of panicking: a filter bug must not kill the VM.
func TestShortRequestSlices(t *testing.T) {
	for _, name := range PresetNames() {
		req := &Request{PromptTokens: 100, TotalBlocks: 3, MatchedBlocks: []int32{3}, MatchedTokens: []int32{100}}
		d := handler(t, name).Run(req, fleet(5), NewScratch(1)).Decode
		if d.Primary() < 0 {
			t.Fatalf("%s: no decision", name)
		}
	}
}

// The guard alone: with affinity weighted far above load, the warm host
// keeps every request until its work passes the bound, then loses it, and
// the explanation names the guard.
func TestImbalanceGuardBound(t *testing.T) {
	cfg, err := config.Parse([]byte(`{"strategy": "p",
		"plugins": [{"name": "g", "type": "load_guard", "params": {"absoluteTokens": 10000, "relative": 1.5, "decodeWeight": 0}}],
		"profiles": {"p": {"filters": ["g"], "scorers": [{"plugin": "prefix_cache", "weight": 100}, {"plugin": "least_request", "weight": 0.01}]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	h, _, err := Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hosts := fleet(3)
	req := newReq(3, 8000, 16)
	req.MatchedBlocks = []int32{16, 0, 0}
	req.MatchedTokens = []int32{8000, 0, 0}
	// Work: warm = load + 0 uncached, cold = 0 + 8000; bound = max(8000 + 10000, 1.5 x 8000) = 18000.
	for _, tc := range []struct {
		load int64
		warm bool
	}{{0, true}, {17000, true}, {18000, true}, {18001, false}, {50000, false}} {
		hosts[0].PendingPrefillTokens = tc.load
		d := h.Run(req, hosts, NewScratch(1)).Decode
		if (d.Primary() == 0) != tc.warm {
			t.Fatalf("warm host at %d tokens: chosen=%v, want %v (%s)", tc.load, d.Primary() == 0, tc.warm, d.Explain(req, hosts))
		}
		if !tc.warm && d.Note != "imbalance guard" {
			t.Fatalf("note %q at %d tokens", d.Note, tc.load)
		}
	}
}
