package filter_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/internal/sim/server"
	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/wasmhosttest"
)

// The whole chain as Envoy runs it: kvroute.router decides (decode host, and
// a prefill host when the estimated uncached prompt reaches the
// disaggregation threshold), kvroute.pd splits. No test header stands in
// for the router here.

type chain struct {
	host     *wasmhost.Host
	url      string
	prefill  []*recorder
	decode   *recorder
	engines  *server.Fleet
	prefillN int
}

// startChain runs router and pd over prefillN simulated prefill engines and
// one decode engine.
func startChain(t *testing.T, prefillN int, threshold int, pdConfig string) *chain {
	t.Helper()
	return startChainRanks(t, prefillN, threshold, pdConfig, 0)
}

// startChainRanks is startChain with every engine serving ranks
// data-parallel ranks (0 or 1: none).
func startChainRanks(t *testing.T, prefillN int, threshold int, pdConfig string, ranks int) *chain {
	t.Helper()
	roles := []string{"decode"}
	for range prefillN {
		roles = append(roles, "prefill")
	}
	f, err := server.Start(server.Options{Replicas: len(roles), Roles: roles, TimeScale: 0.05, TimeScaleSet: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	c := &chain{decode: proxyTo(t, f.Servers[0].Addr), engines: f, prefillN: prefillN}
	dp := ""
	if ranks > 1 {
		dp = fmt.Sprintf(`,"dataParallelSize":%d`, ranks)
	}
	endpoints := fmt.Sprintf(`{"address":%q,"role":"decode"%s}`, c.decode.addr, dp)
	var prefillAddrs []string
	for i := 1; i <= prefillN; i++ {
		r := proxyTo(t, f.Servers[i].Addr)
		c.prefill = append(c.prefill, r)
		prefillAddrs = append(prefillAddrs, r.addr)
		endpoints += fmt.Sprintf(`,{"address":%q,"role":"prefill"%s}`, r.addr, dp)
	}
	if pdConfig == "" {
		pdConfig = "{}"
	}
	cfg := fmt.Sprintf(`{"endpoints":[%s],"strategy":"kv_cache_aware","fallbacks":0,
		"disaggregation":{"prefillStrategy":"kv_cache_aware","threshold":%d},"pd":%s}`, endpoints, threshold, pdConfig)
	c.host, c.url = wasmhosttest.Start(t, wasmhost.Config{
		Module:  testenv.Module(t),
		VMID:    "kvroute",
		Workers: 1,
		Filters: []wasmhost.Filter{
			{RootID: filter.RootRouter, Configuration: cfg, AllowOnHeadersStopIteration: true},
			{RootID: filter.RootPD, Configuration: cfg, AllowOnHeadersStopIteration: true},
		},
		Clusters:     map[string][]string{decodeCluster: {c.decode.addr}, prefillCluster: prefillAddrs},
		RouteCluster: decodeCluster,
		RouteTimeout: 30 * time.Second,
	})
	return c
}

// send posts a completion without any routing header: the router decides.
func (c *chain) send(t *testing.T, body string) reply {
	t.Helper()
	s := &setup{url: c.url, decode: c.decode, prefill: &recorder{}}
	return s.sendRaw(t, "/v1/completions", body, nil)
}

func (c *chain) prefillRequests() int {
	n := 0
	for _, p := range c.prefill {
		n += len(p.inference())
	}
	return n
}

// The decider splits on the estimated uncached tokens on the decode host:
// a short prompt stays whole, a long cold one is split, and the same long
// prefix again (now cached on the decode host, which received its KV) stays
// whole.
func TestChainThreshold(t *testing.T) {
	c := startChain(t, 1, 512, "")
	decodeEngine := c.engines.Servers[0]

	// 1. 400 tokens, cold: below the threshold.
	r := c.send(t, completion(400, 2, false, "short"))
	if r.status != 200 {
		t.Fatalf("short: %d %s", r.status, r.body)
	}
	if m := r.header.Get(markerHeader); m != "" {
		t.Errorf("short prompt marked %q: it should not be split", m)
	}
	if n := c.prefillRequests(); n != 0 {
		t.Fatalf("short prompt reached the prefill host (%d requests)", n)
	}
	if got := decodeEngine.Stats().PromptTokens; got != 400 {
		t.Errorf("decode engine prefilled %d tokens, want 400", got)
	}

	// 2. 1000 tokens, cold: split.
	long := prompt(1000, "long")
	r = c.send(t, fmt.Sprintf(`{"model":"llama-3-8b","prompt":%q,"max_tokens":3}`, long))
	if r.status != 200 {
		t.Fatalf("long: %d %s", r.status, r.body)
	}
	if m := r.header.Get(markerHeader); m != "prefill=remote" {
		t.Errorf("long prompt marker %q, want prefill=remote", m)
	}
	if n := c.prefillRequests(); n != 1 {
		t.Fatalf("%d prefill requests, want 1", n)
	}
	if got := decodeEngine.Stats().PromptTokens; got != 401 {
		t.Errorf("decode engine prefilled %d tokens in all, want 400 + 1", got)
	}
	if dec := c.decode.inference(); gjson.GetBytes(dec[len(dec)-1].body, "kv_transfer_params.remote_engine_id").String() == "" {
		t.Errorf("decode request lacks the prefill's kv_transfer_params")
	}
	if got := c.host.CounterValue("kvroute.pd.requests.disaggregated"); got != 1 {
		t.Errorf("disaggregated = %d", got)
	}

	// 3. The same 1000-token prefix plus 100 new tokens: the decode host
	// holds the prefix, about 100 tokens are uncached, below the threshold.
	r = c.send(t, fmt.Sprintf(`{"model":"llama-3-8b","prompt":%q,"max_tokens":3}`, long+prompt(100, "tail")))
	if r.status != 200 {
		t.Fatalf("extended: %d %s", r.status, r.body)
	}
	if m := r.header.Get(markerHeader); m != "" {
		t.Errorf("cached prefix marked %q: its uncached tail is below the threshold", m)
	}
	if n := c.prefillRequests(); n != 1 {
		t.Errorf("%d prefill requests, want still 1", n)
	}
	if got := gjson.GetBytes(r.body, "usage.prompt_tokens_details.cached_tokens").Int(); got < 900 {
		t.Errorf("decode found %d cached tokens, want the transferred prefix (>= 900)", got)
	}
}

// With two prefill hosts, the prefill goes to the one the router named.
func TestChainPrefillHostAsNamed(t *testing.T) {
	c := startChain(t, 2, 256, "")
	for i := 0; i < 6; i++ {
		r := c.send(t, completion(700, 2, i%2 == 0, fmt.Sprintf("named-%d", i)))
		if r.status != 200 || r.header.Get(markerHeader) != "prefill=remote" {
			t.Fatalf("request %d: %d marker %q %s", i, r.status, r.header.Get(markerHeader), r.body)
		}
	}
	// Each prefill request reached the host named in its destination header,
	// and the engine's kv_transfer_params name that same engine.
	total := 0
	for i, p := range c.prefill {
		for _, e := range p.inference() {
			total++
			if got := e.header.Get(destHeader); got != p.addr {
				t.Errorf("prefill host %d got a request whose destination header names %q", i, got)
			}
		}
	}
	if total != 6 {
		t.Errorf("%d prefill requests, want 6", total)
	}
}

// Engines with data-parallel ranks through the whole chain: the router
// picks a prefill rank and a decode rank, and each hop reaches its
// endpoint (no rank in the destination header) with its own
// x-data-parallel-rank; SGLang's bootstrap room names the prefill rank.
func TestChainRanksOnBothHops(t *testing.T) {
	for _, proto := range []string{"vllm", "sglang"} {
		t.Run(proto, func(t *testing.T) {
			c := startChainRanks(t, 1, 256, `{"protocol":"`+proto+`","bootstrapPort":0}`, 2)
			for i := 0; i < 4; i++ {
				r := c.send(t, completion(700, 2, false, fmt.Sprintf("ranked-%s-%d", proto, i)))
				if r.status != 200 || !strings.HasPrefix(r.header.Get(markerHeader), "prefill=") {
					t.Fatalf("request %d: %d marker %q %s", i, r.status, r.header.Get(markerHeader), r.body)
				}
			}
			pre, dec := c.prefill[0].inference(), c.decode.inference()
			if len(pre) != 4 || len(dec) != 4 {
				t.Fatalf("%d prefill and %d decode requests, want 4 each", len(pre), len(dec))
			}
			seen := map[string]bool{}
			for i, e := range pre {
				rank := e.header.Get("X-Data-Parallel-Rank")
				seen[rank] = true
				if rank != "0" && rank != "1" || e.header.Get(destHeader) != c.prefill[0].addr {
					t.Errorf("prefill %d: rank %q destination %q, want rank 0 or 1 and the endpoint %s", i, rank, e.header.Get(destHeader), c.prefill[0].addr)
				}
				if proto == "sglang" {
					if room := gjson.GetBytes(e.body, "bootstrap_room").Uint(); fmt.Sprint(room%2) != rank {
						t.Errorf("prefill %d on rank %s with bootstrap_room %d (%% 2 = %d)", i, rank, room, room%2)
					}
				}
			}
			for i, e := range dec {
				if rank := e.header.Get("X-Data-Parallel-Rank"); rank != "0" && rank != "1" || e.header.Get(destHeader) != c.decode.addr {
					t.Errorf("decode %d: rank %q destination %q, want rank 0 or 1 and the endpoint %s", i, rank, e.header.Get(destHeader), c.decode.addr)
				}
			}
			if len(seen) != 2 {
				t.Logf("prefill ranks used: %v (four cold prompts spread by load; both ranks usually serve)", seen)
			}
		})
	}
}

// SGLang through the whole chain: the router's prefill host becomes the
// bootstrap host, and the decode engine receives the KV from its peer.
func TestChainSGLang(t *testing.T) {
	c := startChain(t, 1, 512, `{"protocol":"sglang","bootstrapPort":0}`)
	r := c.send(t, completion(1200, 4, true, "chain-sgl"))
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if m := r.header.Get(markerHeader); m != "prefill=bootstrap" {
		t.Errorf("marker %q, want prefill=bootstrap", m)
	}
	sse(t, r.body)
	if got := c.engines.Servers[0].Stats().PromptTokens; got != 1 {
		t.Errorf("decode engine prefilled %d tokens, want 1", got)
	}
	if got := c.engines.Servers[1].Stats().PromptTokens; got != 1200 {
		t.Errorf("prefill engine prefilled %d tokens, want 1200", got)
	}
	dec := c.decode.inference()
	if len(dec) != 1 || gjson.GetBytes(dec[0].body, "bootstrap_host").String() == "" {
		t.Fatalf("decode request without bootstrap fields")
	}
}

// The threshold's edge: 511 estimated uncached tokens stay whole, 512 are
// split (scorer: split when uncached >= threshold). Each case has a chain of
// its own: a response calibrates the model's characters per token, which
// would move the next request's estimate off the edge being tested.
func TestChainThresholdEdge(t *testing.T) {
	for _, tc := range []struct {
		tokens int
		marker string
	}{{511, ""}, {512, "prefill=remote"}} {
		c := startChain(t, 1, 512, "")
		r := c.send(t, completion(tc.tokens, 2, false, fmt.Sprintf("edge-%d", tc.tokens)))
		if r.status != 200 {
			t.Fatalf("%d tokens: %d %s", tc.tokens, r.status, r.body)
		}
		if m := r.header.Get(markerHeader); m != tc.marker {
			t.Errorf("%d uncached tokens: marker %q, want %q", tc.tokens, m, tc.marker)
		}
	}
}
