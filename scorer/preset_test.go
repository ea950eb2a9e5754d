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
