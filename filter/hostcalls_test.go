package filter

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
)

// TestWasmHostCallBudget pins what one routed request asks of the host, so
// that a change that adds a shared-data round trip, an allocation through
// the host or a header read per request shows up here rather than only as
// a slower benchmark. In Wasm every host call is a trip out of the VM, and
// the ones that return bytes a trip back in for memory (docs/performance.md,
// "The Wasm cost model"). The budget is today's count for a
// request whose system prompt the index already holds.
func TestWasmHostCallBudget(t *testing.T) {
	addrs := jsonUpstreams(t, 4, `{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":8}}}`)
	h, url := startRouter(t, addrs, 1, "")
	system := strings.Repeat("You are a careful assistant for the host-call budget. ", 300)
	send := func(i int) {
		if code, body, _ := testenv.Call(t, "POST", url+"/v1/chat/completions", chatBody(system, fmt.Sprintf("question %d", i)), nil); code != 200 {
			t.Fatalf("status %d: %s", code, body)
		}
	}
	// The stream's last callbacks may run after the client has the response.
	settle := func(want int64) map[string]int64 {
		var calls map[string]int64
		testenv.Poll(5*time.Second, func() bool {
			calls = map[string]int64{}
			for _, c := range h.CallStats() {
				calls[c.Name] = c.Count
			}
			return calls["proxy_on_delete"] >= want
		})
		return calls
	}
	const warm, n = 5, 20
	for i := 0; i < warm; i++ {
		send(i)
	}
	before := settle(warm)
	for i := 0; i < n; i++ {
		send(warm + i)
	}
	after := settle(warm + n)
	budget := map[string]float64{
		"proxy_get_shared_data":          7,  // index query (stamp, table, shards), load counters, the gateway's prefix memory bucket
		"proxy_set_shared_data":          2,  // load taken at the decision, released at the end
		"proxy_get_header_map_pairs":     1,  // the strip of client routing headers reads the map once
		"proxy_get_header_map_value":     1,  // :status
		"proxy_replace_header_map_value": 1,  // the destination header
		"proxy_get_buffer_bytes":         2,  // request body, response body
		"proxy_get_property":             1,  // upstream address
		"proxy_on_memory_allocate":       11, // one per host call above that returns bytes (the module answers them from lent buffers)
	}
	for name, max := range budget {
		got := float64(after[name]-before[name]) / n
		if got > max {
			t.Errorf("%s: %.2f per request, budget %.0f", name, got, max)
		}
	}
	if got := float64(after["proxy_on_delete"]-before["proxy_on_delete"]) / n; got != 1 {
		t.Fatalf("measured %.2f streams per request: the counts above are not per request", got)
	}
}
