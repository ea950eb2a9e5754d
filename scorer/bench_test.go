package scorer

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// benchFleet is n hosts with varied load and a request with varied matches,
// as the router hands them to the profile (index lookups excluded).
func benchFleet(n int) ([]Host, *Request) {
	rng := rand.New(rand.NewPCG(uint64(n), 1))
	hosts := fleet(n)
	for i := range hosts {
		h := &hosts[i]
		h.ID = rng.Uint64()
		h.Waiting, h.Running = rng.IntN(8), rng.IntN(64)
		h.KVUsage = rng.Float64()
		h.InFlight = rng.IntN(32)
		h.PendingPrefillTokens = int64(rng.IntN(100000))
		h.PendingDecodeTokens = int64(rng.IntN(20000))
		h.InFlightTokens = int64(rng.IntN(200000))
		h.IndexedBlocks = rng.IntN(30000)
	}
	req := newReq(n, 8000, 32)
	req.MaxTokens = 200
	req.PrefixHash = rng.Uint64()
	for i := range hosts {
		if rng.IntN(4) == 0 {
			b := rng.IntN(33)
			req.MatchedBlocks[i], req.MatchedTokens[i] = int32(b), int32(b*250)
		}
	}
	return hosts, req
}

// BenchmarkDecision measures one decision (filters, scorers, picker,
// fallbacks) per strategy and fleet size. round_robin is the baseline the
// ratios in docs/performance.md are against.
func BenchmarkDecision(b *testing.B) {
	for _, name := range PresetNames() {
		for _, n := range []int{8, 64, 256} {
			b.Run(fmt.Sprintf("%s/hosts=%d", name, n), func(b *testing.B) {
				h, err := NewHandler(name)
				if err != nil {
					b.Fatal(err)
				}
				hosts, req := benchFleet(n)
				s := NewScratch(1)
				h.Run(req, hosts, s) // warm the scratch
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					h.Run(req, hosts, s)
				}
			})
		}
	}
}

// A steady-state decision allocates nothing (the Wasm GC budget).
func TestDecisionDoesNotAllocate(t *testing.T) {
	for _, name := range PresetNames() {
		h := handler(t, name)
		hosts, req := benchFleet(64)
		s := NewScratch(1)
		h.Run(req, hosts, s)
		if a := testing.AllocsPerRun(100, func() { h.Run(req, hosts, s) }); a != 0 {
			t.Errorf("%s: %.1f allocations per decision", name, a)
		}
	}
}
