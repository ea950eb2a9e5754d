package scorer

import (
	"fmt"
	"strings"
	"testing"
)

// fleet returns n healthy aggregated hosts with distinct addresses.
func fleet(n int) []Host {
	hosts := make([]Host, n)
	for i := range hosts {
		hosts[i] = Host{Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Slot: i}
	}
	return hosts
}

func newReq(n, promptTokens, totalBlocks int) *Request {
	r := &Request{}
	r.Reset(n)
	r.PromptTokens = promptTokens
	r.TotalBlocks = totalBlocks
	return r
}

func TestEveryPresetBuildsAndDecides(t *testing.T) {
	for _, name := range PresetNames() {
		t.Run(name, func(t *testing.T) {
			h, err := NewHandler(name)
			if err != nil {
				t.Fatal(err)
			}
			hosts := fleet(4)
			req := newReq(4, 1000, 10)
			req.PrefixHash = 42
			res := h.Run(req, hosts, NewScratch(1))
			if len(res.Decode.Order) != 3 {
				t.Fatalf("order = %v, want primary + 2 fallbacks", res.Decode.Order)
			}
			seen := map[int]bool{}
			for _, o := range res.Decode.Order {
				if o < 0 || o >= 4 || seen[o] {
					t.Fatalf("bad order %v", res.Decode.Order)
				}
				seen[o] = true
			}
			ex := res.Explain(req, hosts)
			if !strings.Contains(ex, "profile="+name) || !strings.Contains(ex, "host=10.0.0.") {
				t.Fatalf("explanation %q", ex)
			}
		})
	}
}

// TestKVCacheAwareWeighsPreciseMatchesLess: kv_cache_aware bets less on a
// match the engine's own events confirm (precise cache state) than on one
// the index guesses, since prefill_cost already credits the cached tokens.
// The host holding 8,192 of a 10,000-token prompt but queueing 13,000 more
// tokens of prefill than an empty-handed host wins under approximate state
// (prefix 3 + cost 3 x (1 - 13000/16384) against 3) and loses under precise
// state (prefix 3 x 0.6667 + the same cost, under 3).
func TestKVCacheAwareWeighsPreciseMatchesLess(t *testing.T) {
	h, err := NewHandler("kv_cache_aware")
	if err != nil {
		t.Fatal(err)
	}
	for _, precise := range []bool{false, true} {
		hosts := fleet(2)
		hosts[0].PendingPrefillTokens = 41192 // cost 41192 + 1808 uncached = 43000
		hosts[1].PendingPrefillTokens = 20000 // cost 20000 + 10000 uncached = 30000
		hosts[0].PreciseCache, hosts[1].PreciseCache = precise, precise
		req := newReq(2, 10000, 10)
		req.MatchedBlocks = []int32{8, 0}
		req.MatchedTokens = []int32{8192, 0}
		res := h.Run(req, hosts, NewScratch(1))
		want := 0
		if precise {
			want = 1
		}
		if got := res.Decode.Order[0]; got != want {
			t.Errorf("precise=%v: picked host %d, want %d\n%s", precise, got, want, res.Explain(req, hosts))
		}
	}
}
