package filter

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/wasmhosttest"
)

// codeCounter counts, through wazero's function listeners, which of the
// module's functions a request enters and how many calls it makes, and by
// which callback (the exported function the host called).
type codeCounter struct {
	mu    sync.Mutex
	depth int
	top   string
	calls int
	// callsByTop counts calls by callback, while non-nil.
	callsByTop map[string]int
	entered    map[uint32]bool
	byTop      map[string]map[uint32]bool
	names      map[uint32]string
}

func (c *codeCounter) NewFunctionListener(api.FunctionDefinition) experimental.FunctionListener {
	return c
}

func (c *codeCounter) Before(_ context.Context, _ api.Module, def api.FunctionDefinition, _ []uint64, _ experimental.StackIterator) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.depth == 0 {
		c.top = fmt.Sprint("function ", def.Index())
		if names := def.ExportNames(); len(names) > 0 {
			c.top = names[0]
		}
	}
	c.depth++
	if def.GoFunction() != nil {
		return // the host's functions are TestWasmHostCallBudget's business
	}
	c.calls++
	if c.callsByTop != nil {
		c.callsByTop[c.top]++
	}
	c.entered[def.Index()] = true
	c.names[def.Index()] = def.DebugName()
	m := c.byTop[c.top]
	if m == nil {
		m = map[uint32]bool{}
		c.byTop[c.top] = m
	}
	m[def.Index()] = true
}

func (c *codeCounter) After(context.Context, api.Module, api.FunctionDefinition, []uint64) {
	c.mu.Lock()
	c.depth--
	c.mu.Unlock()
}

func (c *codeCounter) Abort(context.Context, api.Module, api.FunctionDefinition, error) {
	c.mu.Lock()
	c.depth--
	c.mu.Unlock()
}

// take returns what was counted since the last take.
func (c *codeCounter) take() (calls int, entered map[uint32]bool, byTop map[string]map[uint32]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	calls, entered, byTop = c.calls, c.entered, c.byTop
	c.calls, c.entered, c.byTop = 0, map[uint32]bool{}, map[string]map[uint32]bool{}
	return calls, entered, byTop
}

// wasmCodeSizes reads a module's function imports and the size of each
// function body in its code section, indexed by function index minus the
// imports: what a function costs in Wasm bytes before the host compiles it.
func wasmCodeSizes(t testing.TB, m []byte) (imports int, sizes []int) {
	t.Helper()
	pos := 8 // magic and version
	uleb := func() int {
		v, shift := 0, 0
		for {
			if pos >= len(m) {
				t.Fatal("wasm: truncated LEB128")
			}
			b := m[pos]
			pos++
			v |= int(b&0x7f) << shift
			if b < 0x80 {
				return v
			}
			shift += 7
		}
	}
	for pos < len(m) {
		id := m[pos]
		pos++
		size := uleb()
		end := pos + size
		switch id {
		case 2: // imports: module, name, kind, description
			for n := uleb(); n > 0; n-- {
				pos += uleb()
				pos += uleb()
				kind := m[pos]
				pos++
				switch kind {
				case 0: // function: type index
					uleb()
					imports++
				case 1: // table: reftype, limits
					pos++
					if flags := uleb(); uleb() >= 0 && flags&1 != 0 {
						uleb()
					}
				case 2: // memory: limits
					if flags := uleb(); uleb() >= 0 && flags&1 != 0 {
						uleb()
					}
				case 3: // global: valtype, mutability
					pos += 2
				}
			}
		case 10: // code
			for n := uleb(); n > 0; n-- {
				body := uleb()
				sizes = append(sizes, body)
				pos += body
			}
		}
		pos = end
	}
	return imports, sizes
}

// TestWasmCodeFootprint pins how much of the module one routed request runs.
// In the Wasm host the router's cost is mostly its code coming back into
// the caches: between two requests the host's own work evicts it, and each
// request then pays for every function it enters, whatever that function
// computes (docs/performance.md, "The Wasm cost model"). The distinct
// functions entered and the calls made are exact counts, where the
// benchmark's timings move by 1.5x with the machine; this test fails when a
// change makes the hot path reach for more code. The budget is the current
// count plus about 5 %, for a request whose system prompt the index already
// holds (8K tokens, 16 hosts, the default profile); -v prints the count.
// KVROUTE_FOOTPRINT=<callback> lists what one callback enters.
func TestWasmCodeFootprint(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles the module with function listeners")
	}
	addrs := jsonUpstreams(t, 16, benchCompletion)
	module := testenv.Module(t)
	imports, sizes := wasmCodeSizes(t, module)
	bytesOf := func(fns map[uint32]bool) (n int) {
		for f := range fns {
			if i := int(f) - imports; i >= 0 && i < len(sizes) {
				n += sizes[i]
			}
		}
		return n
	}
	counter := &codeCounter{entered: map[uint32]bool{}, byTop: map[string]map[uint32]bool{}, names: map[uint32]string{}}
	h, front := listenedRouter(t, module, addrs, counter)

	system := strings.Repeat("You are a careful assistant for the kvroute benchmark. ", (32<<10)/55)
	send := func(i int) {
		if code, body, _ := testenv.Call(t, "POST", front+"/v1/chat/completions", chatBody(system, fmt.Sprintf("question number %d", i)), nil); code != 200 {
			t.Fatalf("status %d: %s", code, body)
		}
	}
	// The stream's last callbacks may run after the client has the response.
	settle := func(want int64) {
		testenv.WaitFor(t, fmt.Sprintf("stream %d to end", want), func() bool { return callCount(h, "proxy_on_delete") >= want })
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
	seenBy := map[string]map[uint32]int{}
	for i := 0; i < n; i++ {
		send(warm + i)
		settle(int64(warm + i + 1))
		c, entered, byTop := counter.take()
		calls = append(calls, c)
		for f := range entered {
			seen[f]++
		}
		for top, fns := range byTop {
			if seenBy[top] == nil {
				seenBy[top] = map[uint32]int{}
			}
			for f := range fns {
				seenBy[top][f]++
			}
		}
	}
	typical := func(seen map[uint32]int) map[uint32]bool {
		out := map[uint32]bool{}
		for f, k := range seen {
			if 2*k >= n {
				out[f] = true
			}
		}
		return out
	}
	fns := typical(seen)
	distinct := len(fns)
	slices.Sort(calls)
	median := calls[n/2]
	t.Logf("per routed request: %d distinct functions entered (%d bytes of Wasm code), %d calls (median)", distinct, bytesOf(fns), median)
	tops := slices.Sorted(maps.Keys(seenBy))
	for _, top := range tops {
		f := typical(seenBy[top])
		t.Logf("  %-28s %3d functions, %4d KB", top, len(f), bytesOf(f)>>10)
		// KVROUTE_FOOTPRINT=<callback> lists that callback's functions,
		// largest first (names need a module built without -s -w).
		if os.Getenv("KVROUTE_FOOTPRINT") == top {
			list := slices.SortedFunc(maps.Keys(f), func(a, b uint32) int {
				return sizes[int(b)-imports] - sizes[int(a)-imports]
			})
			for _, fn := range list {
				t.Logf("    %6d %s", sizes[int(fn)-imports], counter.names[fn])
			}
		}
	}
	// The gateway-wide prefix memory (docs/topology.md: one shared-data
	// bucket read per lookup, one compare-and-set per new route) is 3
	// functions, about 7 KB of them and about 10 more calls. The
	// prediction error's books, the correction's stamp and the per-model
	// characters-per-token calibration (docs/cache-state.md) are about
	// 4 KB more, in Decide and at the response's end. The parser's fast
	// paths for bodies of many small values (docs/performance.md, "Body
	// shapes": the validator's word test for short strings, quickEnd in
	// the walker) are about 2.5 KB more. Between runs of this test the
	// figures move by up to 3 functions, 2 KB and 60 calls (the runtime's
	// own work, garbage collection among it; 137 to 139 KB on 2026-11-26):
	// the budgets leave that room. The prefix score's scale for hosts under
	// precise cache state (prefix_cache preciseScale) is 136 bytes more in
	// prefixScorer.Score (144,367 to 144,503 bytes entered). The walker's
	// one call per object (openai's object, which reads compact members
	// with word tests and no call per member) and the hasher's in-place
	// pair of short elements enter 4 fewer functions and make about 50
	// fewer calls, and are 2 to 3.6 KB more code (144,503 to 146,552 or
	// 148,118 bytes entered, the second with the runtime's random number
	// functions): 1 MiB bodies of tiny messages, text parts, image parts
	// and tool calls cost 30 to 40 % less, the searched worst 20 % less.
	// The validator's loop for what follows an escape (scanString: a \u
	// escape by one word test, text between escapes 16 bytes per step) is
	// 581 bytes more (149,481 to 150,062 bytes entered): 1 MiB of CJK
	// text escaped as json.dumps writes it validates 3 times faster in
	// Wasm, and costs a fifth less to route. The validator's table reading
	// on after a \u escape in a short string (scanJSONWith, afterU) is
	// 363 bytes more (150,062 to 150,425): a body of members keyed
	// "a\u0062" routes 20% faster. object's reading of a short string
	// value with two escapes in its loop (rather than by skip and
	// shortString) is 58 bytes more (to 150,483 bytes entered): text parts
	// of surrogate pairs cost a quarter less. shortString's search by
	// words past escapes and object's reading of a null value in its loop
	// (with the validator's change beside them) are 84 bytes more (150,483
	// to 150,567): a body of agent turns (tool calls with escaped JSON
	// arguments, "content": null) costs 8% less. The read budget's first
	// pass (openai's trimmer: trim, value, structureCost, stringEnd and
	// routedKey) is about 5 functions and 11 KB more (150,567 to 161,789
	// bytes entered): it bounds what a 1 MiB body of any shape costs at under 5
	// times plain text, where bodies of small objects cost up to 31 times.
	const maxDistinct, maxBytes, maxCalls = 148, 166 << 10, 650
	if distinct > maxDistinct {
		t.Errorf("a routed request enters %d of the module's functions, budget %d", distinct, maxDistinct)
	}
	if b := bytesOf(fns); b > maxBytes {
		t.Errorf("a routed request enters %d KB of the module's code, budget %d KB", b>>10, maxBytes>>10)
	}
	if median > maxCalls {
		t.Errorf("a routed request makes %d calls inside the module, budget %d", median, maxCalls)
	}
	if distinct < 100 || median < 300 {
		t.Fatalf("counted %d functions and %d calls: the listener did not see the router run", distinct, median)
	}
}

// TestWasmQuietStreamChunks checks, with wazero's function listeners, that
// the chunks of a stream that did not ask for usage are answered by the ABI
// bridge's export alone (filter/quietbody): a token's chunk then costs about
// what the least a filter can do costs, where reading it for a usage report
// enters the SDK's dispatch, the stream's method, the body read and the
// scan. Calls are exact counts, where times move with the machine.
func TestWasmQuietStreamChunks(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles the module with function listeners")
	}
	addrs := benchUpstreams(t, 2)
	counter := &codeCounter{entered: map[uint32]bool{}, byTop: map[string]map[uint32]bool{}, names: map[uint32]string{}, callsByTop: map[string]int{}}
	h, front := listenedRouter(t, testenv.Module(t), addrs, counter)
	callbacks := func() (n int64) {
		for _, c := range h.CallStats() {
			if c.Name == "proxy_on_response_body" {
				n += c.Count
			}
		}
		return n
	}
	// callsPerChunk sends a streamed request and returns the module calls
	// per on_response_body callback, and how many callbacks there were.
	callsPerChunk := func(body string) (float64, int64) {
		n0, ended := callbacks(), callCount(h, "proxy_on_delete")
		counter.mu.Lock()
		counter.callsByTop = map[string]int{}
		counter.mu.Unlock()
		code, resp, _ := testenv.Call(t, "POST", front+"/v1/chat/completions", body, nil)
		if code != 200 || strings.Count(resp, "data: ") < streamedTokens {
			t.Fatalf("status %d, %d events", code, strings.Count(resp, "data: "))
		}
		// The last chunks' callbacks may run after the client has the
		// response: the stream's end (on_delete) comes after every one.
		testenv.WaitFor(t, "the stream's end", func() bool { return callCount(h, "proxy_on_delete") > ended })
		n := callbacks() - n0
		counter.mu.Lock()
		defer counter.mu.Unlock()
		return float64(counter.callsByTop["proxy_on_response_body"]) / float64(n), n
	}
	size := benchSize{"8Ktok", 8 << 10}
	quiet, nq := callsPerChunk(size.streamedBodies(false)(1))
	read, nr := callsPerChunk(size.streamedBodies(true)(2))
	t.Logf("module calls per response-body callback: %.1f without usage asked (%d callbacks), %.1f with it (%d)", quiet, nq, read, nr)
	if nq < streamedTokens/2 {
		t.Fatalf("only %d response-body callbacks for %d events: the events did not arrive as chunks of their own", nq, streamedTokens)
	}
	if quiet <= 0 || read <= 0 {
		t.Fatalf("the listener counted %.1f and %.1f calls per chunk: it did not see the router run", quiet, read)
	}
	if quiet > 4 {
		t.Errorf("a stream without usage makes %.1f module calls per chunk, want at most 4 (the bridge's export answers)", quiet)
	}
	if read < 3*quiet {
		t.Errorf("reading chunks for usage makes %.1f calls per chunk, against %.1f without: the comparison does not measure the quiet path", read, quiet)
	}
	// The last chunk still reaches the filter, which releases the load.
	waitLoadsZero(t, hostStore{h})
}

// listenedRouter runs module's router in a one-worker host whose VM
// reports every function call to counter, in front of addrs, closed with
// the test. The module is compiled afresh, with a compilation cache of the
// test's own: wazero keeps a compiled module's listeners, so a module
// compiled for another test's counter (a process-wide cache) would report
// to that counter and this one would count nothing.
func listenedRouter(t *testing.T, module []byte, addrs []string, counter *codeCounter) (*wasmhost.Host, string) {
	t.Helper()
	ctx := experimental.WithFunctionListenerFactory(context.Background(), counter)
	return wasmhosttest.StartContext(t, ctx, wasmhost.Config{Module: module, VMID: "kvroute", Workers: 1,
		Clusters: map[string][]string{"engines": addrs}, RouteCluster: "engines", CompilationCacheDir: t.TempDir(),
		Filters: []wasmhost.Filter{{RootID: RootRouter, AllowOnHeadersStopIteration: true, Configuration: "{" + endpointsJSON(addrs) + "}"}}})
}
