package filter

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/kvroute/kvroute/internal/wasmhost"
)

// codeCounter counts, through wazero's function listeners, which of the
// module's functions a request enters and how many calls it makes.
type codeCounter struct {
	mu      sync.Mutex
	calls   int
	entered map[uint32]bool
}

func (c *codeCounter) NewFunctionListener(api.FunctionDefinition) experimental.FunctionListener {
	return c
}

func (c *codeCounter) Before(_ context.Context, _ api.Module, def api.FunctionDefinition, _ []uint64, _ experimental.StackIterator) {
	if _, _, imported := def.Import(); imported {
		return // host functions are TestWasmHostCallBudget's business
	}
	c.mu.Lock()
	c.calls++
	c.entered[def.Index()] = true
	c.mu.Unlock()
}

func (c *codeCounter) After(context.Context, api.Module, api.FunctionDefinition, []uint64) {}
func (c *codeCounter) Abort(context.Context, api.Module, api.FunctionDefinition, error)    {}

// take returns what was counted since the last take.
func (c *codeCounter) take() (calls int, entered map[uint32]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	calls, entered = c.calls, c.entered
	c.calls, c.entered = 0, map[uint32]bool{}
	return calls, entered
}

// TestWasmCodeFootprint pins how much of the module one routed request runs.
// In the Wasm host the router's cost is mostly its code coming back into
// the caches: between two requests the host's own work evicts it, and each
// request then pays for every function it enters, whatever that function
// computes (README "Build", "Where the time goes"). The distinct functions
// entered and the calls made are exact counts, where the benchmark's timings
// move by 1.5x with the machine; this test fails when a change makes the
// hot path reach for more code. The budget is today's count (251 functions,
// 994-1,021 calls: random tie-breaks vary) plus about 5 %, for a request
// whose system prompt the index already holds (8K tokens, 16 hosts, the
// default profile).
func TestWasmCodeFootprint(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles the module with function listeners")
	}
	var addrs []string
	for i := 0; i < 16; i++ {
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("content-type", "application/json")
			io.WriteString(w, `{"id":"cmpl-1","choices":[{"text":"ok"}],"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":0}}}`)
		}))
		t.Cleanup(up.Close)
		addrs = append(addrs, up.Listener.Addr().String())
	}
	counter := &codeCounter{entered: map[uint32]bool{}}
	ctx := experimental.WithFunctionListenerFactory(context.Background(), counter)
	h, err := wasmhost.New(ctx, wasmhost.Config{Module: wasmModule(t), VMID: "kvroute", Workers: 1,
		Clusters: map[string][]string{"engines": addrs}, RouteCluster: "engines", CompilationCacheDir: "-",
		Filters: []wasmhost.Filter{{RootID: RootRouter, AllowOnHeadersStopIteration: true, Configuration: "{" + endpointsJSON(addrs) + "}"}}})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(h)
	t.Cleanup(func() { front.Close(); h.Close() })

	system := strings.Repeat("You are a careful assistant for the kvroute benchmark. ", (32<<10)/55)
	send := func(i int) {
		if code, body, _ := call(t, "POST", front.URL+"/v1/chat/completions", chatBody(system, fmt.Sprintf("question number %d", i)), nil); code != 200 {
			t.Fatalf("status %d: %s", code, body)
		}
	}
	// The stream's last callbacks may run after the client has the response.
	deletes := func() int64 {
		for _, c := range h.CallStats() {
			if c.Name == "proxy_on_delete" {
				return c.Count
			}
		}
		return 0
	}
	settle := func(want int64) {
		for deadline := time.Now().Add(5 * time.Second); deletes() < want; {
			if time.Now().After(deadline) {
				t.Fatalf("stream %d did not end", want)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	const warm, n = 10, 20
	for i := 0; i < warm; i++ {
		send(i)
	}
	settle(warm)
	counter.take()
	// Per request: its calls, and the functions it entered. A function
	// counts as the request's if at least half the requests entered it, so
	// that a Go GC cycle or a slow allocation path landing in one of them
	// does not count.
	var calls []int
	seen := map[uint32]int{}
	for i := 0; i < n; i++ {
		send(warm + i)
		settle(int64(warm + i + 1))
		c, entered := counter.take()
		calls = append(calls, c)
		for f := range entered {
			seen[f]++
		}
	}
	distinct := 0
	for _, k := range seen {
		if 2*k >= n {
			distinct++
		}
	}
	slices.Sort(calls)
	median := calls[n/2]
	t.Logf("per routed request: %d distinct functions entered, %d calls (median)", distinct, median)
	const maxDistinct, maxCalls = 265, 1075
	if distinct > maxDistinct {
		t.Errorf("a routed request enters %d of the module's functions, budget %d", distinct, maxDistinct)
	}
	if median > maxCalls {
		t.Errorf("a routed request makes %d calls inside the module, budget %d", median, maxCalls)
	}
	if distinct < 100 || median < 300 {
		t.Fatalf("counted %d functions and %d calls: the listener did not see the router run", distinct, median)
	}
}
