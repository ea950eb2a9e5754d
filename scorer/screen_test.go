package scorer

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/config"
)

// A profile with its screen decides exactly what the same profile without
// it decides (every filter run in turn), and draws the same random numbers,
// on fleets where the screened filters keep everyone and where they do not.
func TestScreenMatchesFilters(t *testing.T) {
	configs := map[string]string{
		"fixed roles, adapters, saturation": `{"plugins": [
			{"name": "h", "type": "healthy", "params": {"dropStale": false, "failOpen": false}},
			{"name": "r", "type": "role", "params": {"role": "both"}},
			{"name": "m", "type": "model", "params": {"requireAdapter": true}},
			{"name": "s", "type": "saturation", "params": {"maxWaiting": 3, "maxKVUsage": 0.5}}],
			"profiles": {"p": {"filters": ["h", "r", "m", "s", "load_guard"],
			"scorers": ["queue", "prefix_cache"], "picker": "max_score"}}, "strategy": "p"}`,
		"decode role, repeated type": `{"plugins": [{"name": "r", "type": "role", "params": {"role": "decode"}}],
			"profiles": {"p": {"filters": ["saturation", "r", "healthy", "saturation", "model"],
			"scorers": ["queue"], "picker": "max_score"}}, "strategy": "p"}`,
	}
	// Two handlers per strategy: stateful pickers (round robin) must not
	// share counters between the screened and the plain run.
	build := func(name string) *Handler {
		src, ok := configs[name]
		if !ok {
			return handler(t, name)
		}
		cfg, err := config.Parse([]byte(src))
		if err != nil {
			t.Fatal(err)
		}
		h, _, err := Build(cfg)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return h
	}
	names := PresetNames()
	for name := range configs {
		names = append(names, name)
	}
	const iterations = 3000
	rng := rand.New(rand.NewPCG(3, 3))
	for _, name := range names {
		screened, plain := build(name).Decode, build(name).Decode
		if screened.screen.filters == 0 {
			t.Fatalf("%s: no screen", name)
		}
		plain.screen = screen{}
		kept := 0
		for iter := 0; iter < iterations; iter++ {
			n := rng.IntN(10)
			hosts, req := screenFleet(rng, n)
			role := []Role{RoleBoth, RoleDecode, RolePrefill}[rng.IntN(3)]
			seed := rng.Uint64()
			sa, sb := NewScratch(seed), NewScratch(seed)
			if screened.screen.keepsAll(&Cycle{Req: req, Hosts: hosts, Role: role}, all(n)) {
				kept++
			}
			da := screened.run(req, hosts, 3, role, sa)
			db := plain.run(req, hosts, 3, role, sb)
			got := fmt.Sprint(da.Order, da.Survivors, da.Note, da.Total)
			want := fmt.Sprint(db.Order, db.Survivors, db.Note, db.Total)
			if got != want {
				t.Fatalf("%s, role %v, hosts %+v: screened %s, filters %s", name, role, hosts, got, want)
			}
			if sa.rng.Uint64() != sb.rng.Uint64() {
				t.Fatalf("%s: different random draws", name)
			}
		}
		if kept == 0 || kept == iterations {
			t.Fatalf("%s: the screen kept everyone in %d of %d decisions: one path untested", name, kept, iterations)
		}
	}
}

// The screen covers the leading per-host filters, each type once.
func TestScreenCoversLeadingFilters(t *testing.T) {
	h, r, m, s := &healthyFilter{}, &roleFilter{}, &modelFilter{}, &saturationFilter{}
	g := &loadGuard{}
	for _, tc := range []struct {
		filters []Filter
		want    int
	}{
		{[]Filter{h, r, m, s, g}, 4},
		{[]Filter{s, m, r, h}, 4},
		{[]Filter{h, g, r}, 1},
		{[]Filter{g, h}, 0},
		{[]Filter{h, r, h, m}, 2},
		{nil, 0},
	} {
		if got := newScreen(tc.filters).filters; got != tc.want {
			t.Errorf("%T: screen covers %d filters, want %d", tc.filters, got, tc.want)
		}
	}
}

// screenFleet is n hosts that mostly pass the per-host filters, with now
// and then a host that fails one of them, and a request for model m1.
func screenFleet(rng *rand.Rand, n int) ([]Host, *Request) {
	hosts := fleet(n)
	rare := func() bool { return rng.IntN(12) == 0 }
	for i := range hosts {
		h := &hosts[i]
		h.BreakerOpen, h.Unhealthy, h.Stale = rare(), rare(), rare()
		if rare() {
			h.Role = Role(1 + rng.IntN(2))
		}
		if rare() {
			h.Model = []string{"m1", "m2"}[rng.IntN(2)]
		}
		if rare() {
			h.Adapters, h.MaxAdapters = []string{"a1"}, 1+rng.IntN(2)
		}
		h.Waiting = rng.IntN(4)
		h.KVUsage = []float64{0.1, 0.4, 0.6}[rng.IntN(3)]
		if rare() {
			h.KVUsage = 0.99
		}
		h.PendingPrefillTokens = int64(rng.IntN(3) * 40000)
		h.InFlight = rng.IntN(3)
	}
	req := newReq(n, 8000, 32)
	req.Model = "m1"
	if rare() {
		req.Model = ""
	}
	if rng.IntN(3) == 0 {
		req.Adapter = "a1"
	}
	req.PrefixHash = rng.Uint64()
	for i := range hosts {
		if rng.IntN(3) == 0 {
			b := rng.IntN(33)
			req.MatchedBlocks[i], req.MatchedTokens[i] = int32(b), int32(b*250)
		}
	}
	return hosts, req
}

// roleKeeps is the role filter's rule: picking for a role, a host serving
// it; a configured role "both", aggregated hosts only.
func TestRoleKeeps(t *testing.T) {
	roles := []Role{RoleBoth, RolePrefill, RoleDecode}
	for _, want := range roles {
		for _, r := range roles {
			rule := want == RoleBoth && r == RoleBoth || want != RoleBoth && r.Serves(want)
			if got := roleKeeps(want, r); got != rule {
				t.Errorf("roleKeeps(%v, %v) = %v, want %v", want, r, got, rule)
			}
		}
	}
}
