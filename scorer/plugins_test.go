package scorer

import (
	"math"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/config"
)

// plugin builds a built-in plugin type with the given params JSON.
func plugin(t *testing.T, typ, params string) Plugin {
	t.Helper()
	cfg := `{"plugins": [{"name": "x", "type": "` + typ + `"`
	if params != "" {
		cfg += `, "params": ` + params
	}
	cfg += `}]}`
	c, err := config.Parse([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	errs := &config.Errors{}
	b := newBuilder(c, errs)
	p := b.instance("x")
	if err := errs.Err(); err != nil {
		t.Fatal(err)
	}
	return p
}

func cycle(hosts []Host, req *Request) *Cycle {
	s := NewScratch(7)
	if req == nil {
		req = newReq(len(hosts), 0, 0)
	}
	return &Cycle{Req: req, Hosts: hosts, MaxPicks: 3, Rand: s.rng, s: s}
}

func all(n int) []int {
	c := make([]int, n)
	for i := range c {
		c[i] = i
	}
	return c
}

func TestFilters(t *testing.T) {
	cases := []struct {
		name, typ, params string
		hosts             func() []Host
		req               func(*Request)
		role              Role
		want              []int
	}{
		{name: "healthy drops breaker-open, unhealthy and stale", typ: "healthy",
			hosts: func() []Host {
				h := fleet(4)
				h[0].BreakerOpen, h[1].Unhealthy, h[2].Stale = true, true, true
				return h
			}, want: []int{3}},
		{name: "healthy keeps stale when told", typ: "healthy", params: `{"dropStale": false}`,
			hosts: func() []Host {
				h := fleet(3)
				h[0].BreakerOpen, h[2].Stale = true, true
				return h
			}, want: []int{1, 2}},
		{name: "healthy fails open when nobody is healthy", typ: "healthy",
			hosts: func() []Host {
				h := fleet(2)
				h[0].BreakerOpen, h[1].Unhealthy = true, true
				return h
			}, want: []int{0, 1}},
		// Stale pushed state marks every host stale at once: health
		// knowledge (unhealthy, breaker open) still keeps hosts out while
		// another candidate remains.
		{name: "healthy keeps the last known healthy when all are stale", typ: "healthy",
			hosts: func() []Host {
				h := fleet(4)
				for i := range h {
					h[i].Stale = true
				}
				h[0].Unhealthy, h[2].BreakerOpen = true, true
				return h
			}, want: []int{1, 3}},
		{name: "healthy fails open when all are stale and none known healthy", typ: "healthy",
			hosts: func() []Host {
				h := fleet(2)
				h[0].Stale, h[1].Stale = true, true
				h[0].Unhealthy, h[1].BreakerOpen = true, true
				return h
			}, want: []int{0, 1}},
		{name: "healthy can refuse instead", typ: "healthy", params: `{"failOpen": false}`,
			hosts: func() []Host {
				h := fleet(2)
				h[0].BreakerOpen, h[1].Unhealthy = true, true
				return h
			}, want: []int{}},
		{name: "role auto keeps everyone when not disaggregated", typ: "role",
			hosts: func() []Host { h := fleet(3); h[0].Role, h[1].Role = RolePrefill, RoleDecode; return h },
			role:  RoleBoth, want: []int{0, 1, 2}},
		{name: "role auto for a prefill pick", typ: "role",
			hosts: func() []Host { h := fleet(3); h[0].Role, h[1].Role = RolePrefill, RoleDecode; return h },
			role:  RolePrefill, want: []int{0, 2}},
		{name: "role fixed decode", typ: "role", params: `{"role": "decode"}`,
			hosts: func() []Host { h := fleet(3); h[0].Role, h[1].Role = RolePrefill, RoleDecode; return h },
			want:  []int{1, 2}},
		{name: "role fixed both means aggregated only", typ: "role", params: `{"role": "both"}`,
			hosts: func() []Host { h := fleet(3); h[0].Role, h[1].Role = RolePrefill, RoleDecode; return h },
			want:  []int{2}},
		{name: "model keeps matching and undeclared hosts", typ: "model",
			hosts: func() []Host { h := fleet(3); h[0].Model, h[1].Model = "llama", "qwen"; return h },
			req:   func(r *Request) { r.Model = "llama" }, want: []int{0, 2}},
		{name: "model without a requested model keeps all", typ: "model",
			hosts: func() []Host { h := fleet(2); h[0].Model = "llama"; return h },
			want:  []int{0, 1}},
		{name: "model with requireAdapter drops full hosts", typ: "model", params: `{"requireAdapter": true}`,
			hosts: func() []Host {
				h := fleet(3)
				h[0].Adapters, h[0].MaxAdapters = []string{"a", "b"}, 2 // full, without c
				h[1].Adapters, h[1].MaxAdapters = []string{"c"}, 1      // has c
				h[2].Adapters, h[2].MaxAdapters = []string{"a"}, 2      // room
				return h
			},
			req: func(r *Request) { r.Adapter = "c" }, want: []int{1, 2}},
		{name: "saturation drops hosts over thresholds", typ: "saturation", params: `{"maxWaiting": 10, "maxKVUsage": 0.9}`,
			hosts: func() []Host {
				h := fleet(4)
				h[0].Waiting, h[1].KVUsage, h[2].Waiting = 10, 0.95, 9
				return h
			}, want: []int{2, 3}},
		{name: "saturation keeps all when all are saturated", typ: "saturation", params: `{"maxWaiting": 1}`,
			hosts: func() []Host { h := fleet(2); h[0].Waiting, h[1].Waiting = 5, 6; return h },
			want:  []int{0, 1}},
		{name: "saturation ignores stale figures", typ: "saturation", params: `{"maxWaiting": 1}`,
			hosts: func() []Host { h := fleet(2); h[0].Waiting, h[0].Stale = 5, true; h[1].Waiting = 5; return h },
			want:  []int{0}},
		{name: "load guard: within the absolute slack nobody is dropped", typ: "load_guard", params: `{"absoluteTokens": 1000, "relative": 1.5}`,
			hosts: func() []Host { h := fleet(3); h[0].PendingPrefillTokens, h[1].PendingPrefillTokens = 900, 0; return h },
			want:  []int{0, 1, 2}},
		{name: "load guard: over both bounds is dropped", typ: "load_guard", params: `{"absoluteTokens": 1000, "relative": 1.5}`,
			hosts: func() []Host {
				h := fleet(3)
				h[0].PendingPrefillTokens, h[1].PendingPrefillTokens, h[2].PendingPrefillTokens = 5000, 2000, 3000
				return h
			}, want: []int{1, 2}}, // bound = max(2000+1000, 1.5*2000) = 3000
		{name: "load guard: relative bound scales with load", typ: "load_guard", params: `{"absoluteTokens": 100, "relative": 2}`,
			hosts: func() []Host {
				h := fleet(2)
				h[0].PendingPrefillTokens, h[1].PendingPrefillTokens = 19000, 10000
				return h
			}, want: []int{0, 1}},
		{name: "load guard with cost basis keeps a busy warm host", typ: "load_guard", params: `{"absoluteTokens": 1000, "relative": 1.5}`,
			hosts: func() []Host { h := fleet(2); h[0].PendingPrefillTokens = 9000; return h },
			// host 0: 9000 + 500 uncached; host 1: 0 + 10000
			req:  func(r *Request) { r.PromptTokens = 10000; r.MatchedTokens = []int32{9500, 0} },
			want: []int{0, 1}},
		{name: "load guard with load basis drops it", typ: "load_guard", params: `{"absoluteTokens": 1000, "relative": 1.5, "basis": "load"}`,
			hosts: func() []Host { h := fleet(2); h[0].PendingPrefillTokens = 9000; return h },
			req:   func(r *Request) { r.PromptTokens = 10000; r.MatchedTokens = []int32{9500, 0} },
			want:  []int{1}},
		{name: "load guard with prefixCredit keeps a backlogged host holding the prompt's prefix", typ: "load_guard", params: `{"absoluteTokens": 1000, "relative": 1.5, "prefixCredit": 1}`,
			hosts: func() []Host { h := fleet(2); h[0].PendingPrefillTokens = 80000; return h },
			// host 0: 80000 + 2000 uncached - 38000 held; host 1: 0 + 40000;
			// bound max(41000, 60000): without the credit host 0 (82000) goes
			req:  func(r *Request) { r.PromptTokens = 40000; r.MatchedTokens = []int32{38000, 0} },
			want: []int{0, 1}},
		{name: "load guard without prefixCredit drops that host", typ: "load_guard", params: `{"absoluteTokens": 1000, "relative": 1.5}`,
			hosts: func() []Host { h := fleet(2); h[0].PendingPrefillTokens = 80000; return h },
			req:   func(r *Request) { r.PromptTokens = 40000; r.MatchedTokens = []int32{38000, 0} },
			want:  []int{1}},
		{name: "load guard's prefixCredit scales with the tokens held", typ: "load_guard", params: `{"absoluteTokens": 1000, "relative": 1.5, "prefixCredit": 1}`,
			hosts: func() []Host { h := fleet(2); h[0].PendingPrefillTokens = 80000; return h },
			// host 0 holds 4000: 80000 + 36000 - 4000 = 112000 > 60000
			req:  func(r *Request) { r.PromptTokens = 40000; r.MatchedTokens = []int32{4000, 0} },
			want: []int{1}},
		{name: "load guard's prefixCredit does not lower the bound", typ: "load_guard", params: `{"absoluteTokens": 1000, "relative": 1.5, "prefixCredit": 2}`,
			hosts: func() []Host {
				h := fleet(3)
				h[0].PendingPrefillTokens, h[1].PendingPrefillTokens, h[2].PendingPrefillTokens = 20000, 45000, 90000
				return h
			},
			// work 60000, 45000 (+ 40000 - 40000 held), 130000; the bound is
			// from the cheapest work (45000: 67500), not its credited 0, so
			// host 0 stays; host 2 holds nothing and goes
			req:  func(r *Request) { r.PromptTokens = 40000; r.MatchedTokens = []int32{0, 40000, 0} },
			want: []int{0, 1}},
		{name: "load guard counts decode tokens by weight", typ: "load_guard", params: `{"absoluteTokens": 1000, "relative": 1, "decodeWeight": 1}`,
			hosts: func() []Host { h := fleet(2); h[0].PendingDecodeTokens = 1500; return h },
			want:  []int{1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := plugin(t, tc.typ, tc.params).(Filter)
			hosts := tc.hosts()
			req := newReq(len(hosts), 100, 1)
			if tc.req != nil {
				tc.req(req)
			}
			c := cycle(hosts, req)
			c.Role = tc.role
			got := f.Filter(c, all(len(hosts)))
			if !slices.Equal(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
				t.Fatalf("kept %v, want %v", got, tc.want)
			}
		})
	}
}

func TestScorers(t *testing.T) {
	cases := []struct {
		name, typ, params string
		cat               Category
		hosts             func() []Host
		req               func(*Request)
		want              []float64
	}{
		{name: "prefix cache in blocks is matched over total blocks", typ: "prefix_cache", params: `{"unit": "blocks"}`, cat: Affinity,
			hosts: func() []Host { return fleet(3) },
			req: func(r *Request) {
				r.TotalBlocks = 8
				r.MatchedBlocks = []int32{8, 2, 0}
				r.MatchedTokens = []int32{1000, 100, 0}
			},
			want: []float64{1, 0.25, 0}},
		{name: "prefix cache in tokens is matched over prompt tokens", typ: "prefix_cache", cat: Affinity,
			hosts: func() []Host { return fleet(3) },
			req: func(r *Request) {
				r.PromptTokens, r.TotalBlocks = 1000, 8
				r.MatchedBlocks, r.MatchedTokens = []int32{8, 2, 0}, []int32{1000, 100, 0}
			},
			want: []float64{1, 0.1, 0}},
		{name: "prefix cache on a token scale", typ: "prefix_cache", params: `{"scaleTokens": 4000}`, cat: Affinity,
			hosts: func() []Host { return fleet(3) },
			req: func(r *Request) {
				r.PromptTokens, r.TotalBlocks = 10000, 8
				r.MatchedBlocks, r.MatchedTokens = []int32{8, 2, 0}, []int32{10000, 1000, 0}
			},
			want: []float64{1, 0.25, 0}},
		// A confirmed match (precise cache state) weighs preciseScale of a
		// guessed one: prefill_cost already credits it.
		{name: "prefix cache scales hosts under precise cache state", typ: "prefix_cache", params: `{"scaleTokens": 4000, "preciseScale": 0.5}`, cat: Affinity,
			hosts: func() []Host { h := fleet(3); h[0].PreciseCache, h[2].PreciseCache = true, true; return h },
			req: func(r *Request) {
				r.PromptTokens, r.TotalBlocks = 10000, 8
				r.MatchedBlocks, r.MatchedTokens = []int32{8, 8, 2}, []int32{10000, 10000, 1000}
			},
			want: []float64{0.5, 1, 0.125}},
		{name: "prefix cache without blocks scores 0", typ: "prefix_cache", cat: Affinity,
			hosts: func() []Host { return fleet(2) }, req: func(r *Request) { r.TotalBlocks = 0 },
			want: []float64{0, 0}},
		{name: "kv utilization", typ: "kv_utilization", cat: Balance,
			hosts: func() []Host { h := fleet(3); h[0].KVUsage, h[1].KVUsage, h[2].Stale = 0.25, 1, true; return h },
			want:  []float64{0.75, 0, 0.5}},
		{name: "queue is min-max normalised", typ: "queue", cat: Distribution,
			hosts: func() []Host { h := fleet(3); h[0].Waiting, h[1].Waiting, h[2].Waiting = 2, 10, 6; return h },
			want:  []float64{1, 0, 0.5}},
		{name: "equal queues all score 1", typ: "queue", cat: Distribution,
			hosts: func() []Host { h := fleet(2); h[0].Waiting, h[1].Waiting = 3, 3; return h },
			want:  []float64{1, 1}},
		{name: "running", typ: "running", cat: Distribution,
			hosts: func() []Host { h := fleet(2); h[0].Running = 4; return h },
			want:  []float64{0, 1}},
		{name: "least request reads the gateway's in-flight", typ: "least_request", cat: Distribution,
			hosts: func() []Host { h := fleet(3); h[0].InFlight, h[1].InFlight, h[2].Running = 1, 3, 100; return h },
			want:  []float64{2.0 / 3, 0, 1}},
		{name: "pending tokens weigh decode tokens", typ: "pending_tokens", params: `{"decodeWeight": 0.5}`, cat: Distribution,
			hosts: func() []Host {
				h := fleet(3)
				h[0].PendingPrefillTokens = 1000
				h[1].PendingDecodeTokens = 1000 // counts 500
				return h
			},
			want: []float64{0, 0.5, 1}},
		{name: "prefill cost: queued plus uncached tokens", typ: "prefill_cost", params: `{"decodeWeight": 0}`, cat: Distribution,
			hosts: func() []Host { h := fleet(3); h[0].PendingPrefillTokens = 3000; return h },
			req: func(r *Request) {
				r.PromptTokens = 2000
				r.MatchedTokens = []int32{2000, 1000, 0}
			},
			// costs 3000, 1000, 2000
			want: []float64{1.0 / 3, 1, 0.5}},
		{name: "prefill cost on a token scale", typ: "prefill_cost", params: `{"decodeWeight": 0, "scaleTokens": 2000}`, cat: Distribution,
			hosts: func() []Host { h := fleet(3); h[0].PendingPrefillTokens = 3000; return h },
			req: func(r *Request) {
				r.PromptTokens = 2000
				r.MatchedTokens = []int32{2000, 1000, 0}
			},
			// costs 3000, 1000, 2000: 2000 and 1000 extra tokens
			want: []float64{0, 1, 0.5}},
		{name: "session affinity", typ: "session_affinity", cat: Affinity,
			hosts: func() []Host { return fleet(3) }, req: func(r *Request) { r.PinnedAddress = "10.0.0.2:8000" },
			want: []float64{0, 1, 0}},
		{name: "session affinity without a pin", typ: "session_affinity", cat: Affinity,
			hosts: func() []Host { return fleet(2) }, want: []float64{0, 0}},
		{name: "prefix memory", typ: "prefix_memory", cat: Affinity,
			hosts: func() []Host { return fleet(3) }, req: func(r *Request) { r.PrefixAddress = "10.0.0.3:8000" },
			want: []float64{0, 0, 1}},
		{name: "prefix home without a prefix scores 0", typ: "prefix_home", cat: Affinity,
			hosts: func() []Host { return fleet(3) }, want: []float64{0, 0, 0}},
		{name: "lora affinity: loaded, loadable, full", typ: "lora_affinity", cat: Affinity,
			hosts: func() []Host {
				h := fleet(3)
				h[0].Adapters = []string{"x"}
				h[1].Adapters, h[1].MaxAdapters = []string{"y"}, 2
				h[2].Adapters, h[2].MaxAdapters = []string{"y"}, 1
				return h
			},
			req:  func(r *Request) { r.Adapter = "x" },
			want: []float64{1, 0.5, 0}},
		{name: "latency: fastest scores 1, unknown scores 1", typ: "latency", cat: Balance,
			hosts: func() []Host { h := fleet(3); h[0].LatencyEWMAMs, h[1].LatencyEWMAMs = 100, 400; return h },
			want:  []float64{1, 0.25, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := plugin(t, tc.typ, tc.params).(Scorer)
			if s.Category() != tc.cat {
				t.Fatalf("category %v, want %v", s.Category(), tc.cat)
			}
			hosts := tc.hosts()
			req := newReq(len(hosts), 100, 1)
			if tc.req != nil {
				tc.req(req)
			}
			out := make([]float64, len(hosts))
			s.Score(cycle(hosts, req), all(len(hosts)), out)
			for i := range out {
				if math.Abs(out[i]-tc.want[i]) > 1e-9 {
					t.Fatalf("scores %v, want %v", out, tc.want)
				}
			}
		})
	}
}

func TestPickers(t *testing.T) {
	hosts := fleet(4)
	scores := []float64{0.2, 0.9, 0.5, 0.9}
	t.Run("max score picks a top score and falls back by score", func(t *testing.T) {
		p := plugin(t, "max_score", "").(Picker)
		seen := map[int]int{}
		for i := 0; i < 200; i++ {
			c := cycle(hosts, nil)
			c.Rand.Uint64()
			for j := 0; j < i; j++ {
				c.Rand.Uint64()
			}
			o := p.Pick(c, all(4), scores, nil)
			if len(o) != 3 || (o[0] != 1 && o[0] != 3) || o[2] != 2 {
				t.Fatalf("order %v", o)
			}
			seen[o[0]]++
		}
		if seen[1] < 50 || seen[3] < 50 {
			t.Fatalf("ties not broken at random: %v", seen)
		}
	})
	t.Run("max score round-robin ties", func(t *testing.T) {
		p := plugin(t, "max_score", `{"tieBreak": "round_robin"}`).(Picker)
		var got []int
		for i := 0; i < 4; i++ {
			got = append(got, p.Pick(cycle(hosts, nil), all(4), scores, nil)[0])
		}
		if !slices.Equal(got, []int{1, 3, 1, 3}) {
			t.Fatalf("primaries %v", got)
		}
	})
	t.Run("weighted random follows the softmax", func(t *testing.T) {
		p := plugin(t, "weighted_random", `{"temperature": 0.1}`).(Picker)
		c := cycle(hosts, nil)
		count := make([]int, 4)
		for i := 0; i < 4000; i++ {
			count[p.Pick(c, all(4), []float64{0, 0.1, 0, 0}, nil)[0]]++
		}
		// P(1) = e / (e + 3) = 0.475
		if count[1] < 1700 || count[1] > 2100 {
			t.Fatalf("host 1 picked %d of 4000, want about 1900", count[1])
		}
	})
	t.Run("power of two never picks the worst of two", func(t *testing.T) {
		p := plugin(t, "power_of_two", "").(Picker)
		c := cycle(hosts, nil)
		count := make([]int, 4)
		for i := 0; i < 3000; i++ {
			count[p.Pick(c, all(4), []float64{0.1, 0.2, 0.3, 0.4}, nil)[0]]++
		}
		// The lowest wins only if drawn twice, which cannot happen.
		if count[0] != 0 || count[3] < 1300 {
			t.Fatalf("counts %v", count)
		}
	})
	t.Run("round robin cycles", func(t *testing.T) {
		p := plugin(t, "round_robin", "").(Picker)
		var got []int
		for i := 0; i < 6; i++ {
			o := p.Pick(cycle(hosts, nil), []int{0, 2, 3}, nil, nil)
			got = append(got, o[0])
			if o[1] == o[0] {
				t.Fatalf("fallback repeats primary: %v", o)
			}
		}
		if !slices.Equal(got, []int{0, 2, 3, 0, 2, 3}) {
			t.Fatalf("primaries %v", got)
		}
	})
	t.Run("random is uniform", func(t *testing.T) {
		p := plugin(t, "random", "").(Picker)
		c := cycle(hosts, nil)
		count := make([]int, 4)
		for i := 0; i < 4000; i++ {
			count[p.Pick(c, all(4), nil, nil)[0]]++
		}
		for _, n := range count {
			if n < 850 || n > 1150 {
				t.Fatalf("counts %v", count)
			}
		}
	})
}

// prefix_home gives exactly one home per prefix, the same one whatever the
// candidate order, and spreads prefixes over hosts.
func TestPrefixHome(t *testing.T) {
	s := plugin(t, "prefix_home", "").(Scorer)
	hosts := fleet(8)
	homes := make([]int, 8)
	for k := uint64(1); k <= 800; k++ {
		req := newReq(8, 100, 4)
		req.PrefixHash = k * 0x9e3779b97f4a7c15
		out := make([]float64, 8)
		s.Score(cycle(hosts, req), all(8), out)
		home, ones := -1, 0
		for h, v := range out {
			if v == 1 {
				home, ones = h, ones+1
			}
		}
		if ones != 1 {
			t.Fatalf("key %d: scores %v", k, out)
		}
		rev := []int{7, 6, 5, 4, 3, 2, 1, 0}
		out2 := make([]float64, 8)
		s.Score(cycle(hosts, req), rev, out2)
		if out2[home] != 1 {
			t.Fatalf("key %d: home depends on candidate order", k)
		}
		homes[home]++
	}
	for _, n := range homes {
		if n < 60 || n > 140 {
			t.Fatalf("homes per host %v", homes)
		}
	}
}
