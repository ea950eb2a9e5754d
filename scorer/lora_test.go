package scorer

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/config"
)

// The default profile decides a base-model request exactly as it would
// without lora_affinity (same order, same totals), whatever the hosts'
// adapter state; a request naming an adapter goes to the host that holds
// it, or else away from hosts whose slots are full.
func TestDefaultProfileLoRAAffinity(t *testing.T) {
	with, err := NewHandler("kv_cache_aware")
	if err != nil {
		t.Fatal(err)
	}
	src, _ := PresetConfig("kv_cache_aware")
	src = strings.Replace(src, `,
		            {"plugin": "lora_affinity", "weight": 3}`, "", 1)
	cfg, err := config.Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	without, _, err := Build(cfg)
	if err != nil || len(without.Decode.Scorers) != len(with.Decode.Scorers)-1 {
		t.Fatalf("profile without lora_affinity: %v (%d scorers)", err, len(without.Decode.Scorers))
	}
	rng := rand.New(rand.NewPCG(3, 3))
	sw, so := NewScratch(1), NewScratch(1)
	for iter := 0; iter < 500; iter++ {
		hosts := fleet(5)
		for i := range hosts {
			h := &hosts[i]
			h.Waiting, h.PendingPrefillTokens, h.KVUsage = rng.IntN(4), int64(rng.IntN(5000)), rng.Float64()
			h.Adapters, h.MaxAdapters, h.AdapterSlotsUsed = []string{"a"}, 2, rng.IntN(3)
		}
		req := newReq(5, 1000+rng.IntN(4000), 10)
		a := with.Run(req, hosts, sw).Decode
		b := without.Run(req, hosts, so).Decode
		for _, h := range a.Order {
			if a.Total[h] != b.Total[h] {
				t.Fatalf("base-model request: host %d total %v with lora_affinity, %v without", h, a.Total[h], b.Total[h])
			}
		}
		if len(a.Order) != len(b.Order) || a.Order[0] != b.Order[0] {
			t.Fatalf("base-model request: order %v with lora_affinity, %v without", a.Order, b.Order)
		}
	}
	hosts := fleet(3)
	hosts[0].Adapters, hosts[0].MaxAdapters, hosts[0].AdapterSlotsUsed = []string{"x"}, 2, 2 // full
	hosts[1].Adapters, hosts[1].MaxAdapters, hosts[1].AdapterSlotsUsed = []string{"y"}, 2, 1 // room
	hosts[2].Adapters, hosts[2].MaxAdapters, hosts[2].AdapterSlotsUsed = []string{"fin"}, 2, 1
	req := newReq(3, 2000, 10)
	req.Adapter = "fin"
	if got := with.Run(req, hosts, sw).Decode.Order[0]; got != 2 {
		t.Errorf("adapter loaded on host 2: picked %d", got)
	}
	req.Adapter = "new"
	if d := with.Run(req, hosts, sw).Decode; d.Order[0] == 0 || d.Order[len(d.Order)-1] != 0 {
		t.Errorf("host 0 is full: order %v, want it last", d.Order)
	}
	base := newReq(3, 10, 1)
	res := with.Run(base, hosts, sw)
	if ex := res.Explain(base, hosts); strings.Contains(ex, "lora_affinity") {
		t.Errorf("explanation of a base-model decision mentions the skipped scorer: %s", ex)
	}
}
