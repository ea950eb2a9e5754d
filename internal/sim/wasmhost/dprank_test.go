package wasmhost

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/internal/testenv"
)

// An endpoint serving two data-parallel ranks is two cache locations: each
// prompt prefix sticks to the rank that holds it, the engine learns the
// rank from x-data-parallel-rank, and a client cannot pick the rank.
func TestKvrouteDataParallelRanksAreCacheLocations(t *testing.T) {
	var mu sync.Mutex
	var ranks []string
	release := make(chan struct{})
	held := make(chan struct{})
	eng := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ranks = append(ranks, r.Header.Get("X-data-parallel-rank"))
		first := len(ranks) == 1
		mu.Unlock()
		if first { // held in flight while the second prompt is routed
			close(held)
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"cmpl-1","choices":[{"text":"ok"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`))
	})
	cfg := `{"endpoints":[{"address":"` + eng.addr + `","dataParallelSize":2}]}`
	h, url := startHost(t, Config{Module: testenv.Module(t), VMID: "kvroute",
		Filters:  []Filter{{RootID: "kvroute.router", Configuration: cfg, AllowOnHeadersStopIteration: true}},
		Clusters: map[string][]string{"engines": {eng.addr}}, RouteCluster: "engines"})
	prompts := []string{strings.Repeat("the first system prompt ", 200), strings.Repeat("another system prompt entirely ", 200)}
	last := func() string {
		mu.Lock()
		defer mu.Unlock()
		return ranks[len(ranks)-1]
	}
	home := map[int]string{}
	// The first prompt's request stays in flight on its rank while the
	// second prompt, which matches nothing, is routed: the load is counted
	// per rank, so it goes to the other one.
	done := make(chan result, 1)
	go func() {
		done <- do(t, "POST", url+"/v1/completions", `{"model":"m","prompt":"`+prompts[0]+`"}`, nil)
	}()
	<-held
	if r := do(t, "POST", url+"/v1/completions", `{"model":"m","prompt":"`+prompts[1]+`"}`, nil); r.code != 200 {
		t.Fatalf("second prompt: %d %s", r.code, r.body)
	}
	close(release)
	if r := <-done; r.code != 200 {
		t.Fatalf("first prompt: %d %s", r.code, r.body)
	}
	mu.Lock()
	home[0], home[1] = ranks[0], ranks[1]
	mu.Unlock()
	for i := range 10 {
		p := i % 2
		// A client-supplied rank must never reach the engine as sent.
		r := do(t, "POST", url+"/v1/completions", `{"model":"m","prompt":"`+prompts[p]+`"}`,
			map[string]string{"X-Data-Parallel-Rank": "7"})
		if r.code != 200 {
			t.Fatalf("request %d: %d %s", i, r.code, r.body)
		}
		got := last()
		if got != "0" && got != "1" {
			t.Fatalf("request %d: engine saw x-data-parallel-rank %q, want the router's 0 or 1", i, got)
		}
		if h, ok := home[p]; !ok {
			home[p] = got
		} else if got != h {
			t.Errorf("request %d: prompt %d went to rank %s, its prefix is on rank %s", i, p, got, h)
		}
	}
	if home[0] == home[1] {
		t.Errorf("both prompts on rank %s: the second rank is not a location of its own", home[0])
	}
	if h.VMFailures() != 0 {
		t.Errorf("VM failures: %v", h.LogsContaining("failed"))
	}
}

// An endpoint without ranks gets no rank header, and a client's is removed
// and counted (client_rank_header_removed): a client does not pick a rank,
// and one the endpoint lacks (3 here) never reaches the engine.
func TestKvrouteNoRankHeaderWithoutRanks(t *testing.T) {
	eng := newUpstream(t, nil)
	h, url := startHost(t, Config{Module: testenv.Module(t), VMID: "kvroute",
		Filters:  []Filter{{RootID: "kvroute.router", Configuration: routerConfig([]string{eng.addr}, ""), AllowOnHeadersStopIteration: true}},
		Clusters: map[string][]string{"engines": {eng.addr}}, RouteCluster: "engines"})
	r := do(t, "POST", url+"/v1/completions", `{"model":"m","prompt":"hi"}`, map[string]string{"X-Data-Parallel-Rank": "3"})
	if r.code != 200 {
		t.Fatalf("%d %s", r.code, r.body)
	}
	if got := eng.lastHeader("X-Data-Parallel-Rank"); got != "" {
		t.Errorf("engine saw x-data-parallel-rank %q, want none", got)
	}
	if got := h.CounterValue("kvroute.router.client_rank_header_removed"); got != 1 {
		t.Errorf("client_rank_header_removed = %d, want 1", got)
	}
	if r := do(t, "POST", url+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil); r.code != 200 {
		t.Fatalf("%d %s", r.code, r.body)
	}
	if got := h.CounterValue("kvroute.router.client_rank_header_removed"); got != 1 {
		t.Errorf("client_rank_header_removed = %d after a request without one, want 1", got)
	}
}
