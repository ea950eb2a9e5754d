package filter

// Wasm integration tests of kvroute.router: the built dist/kvroute.wasm in
// internal/sim/wasmhost (an Envoy-like host on wazero), in front of simulated
// vLLM engines (internal/sim/server) on loopback.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/sim/server"
	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/wasmhosttest"
)

func startFleet(t testing.TB, opt server.Options) *server.Fleet {
	t.Helper()
	f, err := server.Start(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// jsonUpstreams starts n upstreams that read the request and answer body
// (a JSON completion) and returns their addresses.
func jsonUpstreams(t testing.TB, n int, body string) []string {
	t.Helper()
	var addrs []string
	for i := 0; i < n; i++ {
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("content-type", "application/json")
			io.WriteString(w, body)
		}))
		t.Cleanup(up.Close)
		addrs = append(addrs, up.Listener.Addr().String())
	}
	return addrs
}

func endpointsJSON(addrs []string) string {
	var eps []string
	for _, a := range addrs {
		eps = append(eps, fmt.Sprintf(`{"address":%q}`, a))
	}
	return `"endpoints":[` + strings.Join(eps, ",") + `]`
}

// startRouter runs the router filter in a host with the given plugin
// configuration (without braces) and returns the host and its URL. Streams
// go to the workers in turn (wasmhost.DispatchStream), so that one client
// runs every worker VM.
func startRouter(t testing.TB, addrs []string, workers int, cfg string) (*wasmhost.Host, string) {
	t.Helper()
	return startRouterConfig(t, addrs, workers, "{"+endpointsJSON(addrs)+cfg+"}")
}

// startRouterConfig is startRouter with the whole plugin configuration
// given, its endpoints other than the cluster's addresses if need be.
func startRouterConfig(t testing.TB, addrs []string, workers int, config string) (*wasmhost.Host, string) {
	t.Helper()
	return startRouterClock(t, addrs, workers, config, nil)
}

// startRouterClock is startRouterConfig on a host whose wall clock is
// clock, which the test moves itself (nil: the real clock).
func startRouterClock(t testing.TB, addrs []string, workers int, config string, clock *testenv.Clock) (*wasmhost.Host, string) {
	t.Helper()
	cfg := wasmhost.Config{
		Module: testenv.Module(t), VMID: "kvroute", Workers: workers, Dispatch: wasmhost.DispatchStream,
		Filters: []wasmhost.Filter{{RootID: RootRouter, AllowOnHeadersStopIteration: true,
			Configuration: config}},
		Clusters: map[string][]string{"engines": addrs}, RouteCluster: "engines",
	}
	if clock != nil {
		cfg.Clock = clock.Now
	}
	return wasmhosttest.Start(t, cfg)
}

// servedBy posts body (a chat completion) to the router at url with the
// headers hdr, and returns the upstream of h that served it.
func servedBy(t testing.TB, h *wasmhost.Host, url, body string, hdr map[string]string) string {
	t.Helper()
	before := h.UpstreamRequests()
	if code, b, _ := testenv.Call(t, "POST", url+"/v1/chat/completions", body, hdr); code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	for a, n := range h.UpstreamRequests() {
		if n != before[a] {
			return a
		}
	}
	t.Fatal("no upstream served the request")
	return ""
}

// systemPrompt is one of n long shared prefixes (about 2 KB each).
func systemPrompt(i int) string {
	return fmt.Sprintf("System prompt %d. ", i) + strings.Repeat(fmt.Sprintf("Tenant %d rules: answer in the house style, cite sources, never guess. ", i), 28)
}

func chatBody(system, user string) string {
	return fmt.Sprintf(`{"model":"llama-3-8b","messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"max_tokens":4}`, system, user)
}

// cachedTokensFor replays a shared-system-prompt workload through a fresh
// fleet and host running strategy, and returns the cached prompt tokens the
// engines reported.
func cachedTokensFor(t *testing.T, strategy string) int64 {
	// 8 engines, each with room for about three of the 16 system prompts
	// (the fleet holds them all): round robin shows every engine every
	// prompt and thrashes; affinity partitions the prompts.
	f := startFleet(t, server.Options{Replicas: 8, TimeScale: 0, TimeScaleSet: true, KVBlocks: 110})
	_, url := startRouter(t, f.Addrs(), 2, `,"strategy":"`+strategy+`","fallbacks":0`)
	rng := rand.New(rand.NewSource(7))
	var cached int64
	for i := 0; i < 320; i++ {
		code, body, _ := testenv.Call(t, "POST", url+"/v1/chat/completions", chatBody(systemPrompt(rng.Intn(16)), fmt.Sprintf("question %d", i)), nil)
		if code != 200 {
			t.Fatalf("%s request %d: %d %s", strategy, i, code, body)
		}
		cached += gjson.Get(body, "usage.prompt_tokens_details.cached_tokens").Int()
	}
	return cached
}

func TestWasmSharedPrefixBeatsRoundRobin(t *testing.T) {
	rr := cachedTokensFor(t, "round_robin")
	kv := cachedTokensFor(t, "kv_cache_aware")
	t.Logf("cached prompt tokens over 320 requests: kv_cache_aware %d, round_robin %d", kv, rr)
	if kv == 0 || kv < 3*rr {
		t.Errorf("kv_cache_aware cached %d tokens, want at least 3x round robin's %d", kv, rr)
	}
}

// A prefix recorded by one worker VM is found by the other: the index
// lives in shared data. Consecutive requests alternate between the two
// workers, so each pair below is decided by different VMs.
func TestWasmWorkersShareOneIndex(t *testing.T) {
	f := startFleet(t, server.Options{Replicas: 4, TimeScale: 0, TimeScaleSet: true})
	h, url := startRouter(t, f.Addrs(), 2, `,"fallbacks":0`)
	served := func(body string) string { return servedBy(t, h, url, body, nil) }
	for i := 0; i < 6; i++ {
		sys := systemPrompt(100 + i)
		a := served(chatBody(sys, "first"))
		b := served(chatBody(sys, "second"))
		if a != b {
			t.Errorf("prefix %d: worker A sent it to %s, worker B to %s; B should find A's record", i, a, b)
		}
	}
}

func TestWasmStateEndpointAuth(t *testing.T) {
	f := startFleet(t, server.Options{Replicas: 4, TimeScale: 0, TimeScaleSet: true})
	addrs := f.Addrs()
	h, url := startRouter(t, addrs, 2, `,"strategy":"round_robin","fallbacks":0,"state":{"token":"`+stateToken+`"}`)
	push := pushBody(time.Now().UnixMilli(), addrs[2], addrs[3])
	for _, tc := range []struct {
		name, auth, body string
		want             int
	}{
		{"missing token", "", push, 401},
		{"wrong token", "Bearer wrong", push, 401},
		{"malformed body", "Bearer " + stateToken, `{"version":1,`, 400},
		{"timestamp 1e400", "Bearer " + stateToken, pushBodyRaw("1e400", addrs[2]), 400},
		{"fractional timestamp", "Bearer " + stateToken, pushBodyRaw("1800000000000.25", addrs[2]), 400},
		{"timestamp an hour ahead", "Bearer " + stateToken, pushBody(time.Now().Add(time.Hour).UnixMilli(), addrs[2]), 400},
	} {
		hdr := map[string]string{}
		if tc.auth != "" {
			hdr["authorization"] = tc.auth
		}
		if code, body, _ := testenv.Call(t, "POST", url+"/.kvroute/v1/state", tc.body, hdr); code != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, code, body, tc.want)
		}
		if _, _, ok := h.SharedData(stateGenKey); ok {
			t.Fatalf("%s: a rejected push wrote state", tc.name)
		}
	}
	// Nothing changed: all four engines still serve.
	for i := 0; i < 8; i++ {
		testenv.Call(t, "POST", url+"/v1/completions", completion, nil)
	}
	if n := len(h.UpstreamRequests()); n != 4 {
		t.Fatalf("before the push %d engines served, want 4", n)
	}
	if code, body, _ := testenv.Call(t, "POST", url+"/.kvroute/v1/state", push, map[string]string{"authorization": "Bearer " + stateToken}); code != 200 {
		t.Fatalf("good push: %d %s", code, body)
	}
	before := h.UpstreamRequests()
	for i := 0; i < 8; i++ { // both workers must pick the push up
		testenv.Call(t, "POST", url+"/v1/completions", completion, nil)
	}
	after := h.UpstreamRequests()
	for _, a := range addrs[:2] {
		if after[a] != before[a] {
			t.Errorf("%s is not in the pushed state but still got requests", a)
		}
	}
	if after[addrs[2]]+after[addrs[3]]-before[addrs[2]]-before[addrs[3]] != 8 {
		t.Errorf("pushed hosts did not get the 8 requests: %v -> %v", before, after)
	}
	if got := h.CounterValue("kvroute.router.state.unauthorized"); got != 2 {
		t.Errorf("state.unauthorized = %d, want 2", got)
	}
	// The module's wall clock (its own clock_time_get import) agrees with
	// the host's: a push stamped now is fresh, one stamped an hour ago is
	// stale.
	if got := h.CounterValue("kvroute.router.stale_state"); got != 0 {
		t.Errorf("a push stamped now was counted stale %d times", got)
	}
	// A push older than the state in force is refused and changes nothing.
	old := pushBody(time.Now().Add(-time.Hour).UnixMilli(), addrs[0], addrs[1])
	if code, body, _ := testenv.Call(t, "POST", url+"/.kvroute/v1/state", old, map[string]string{"authorization": "Bearer " + stateToken}); code != 409 {
		t.Fatalf("a push older than the state in force: %d %s, want 409", code, body)
	}
	if got := h.CounterValue("kvroute.router.state.rejected_older"); got != 1 {
		t.Errorf("state.rejected_older = %d, want 1", got)
	}
	before = h.UpstreamRequests()
	for i := 0; i < 4; i++ {
		testenv.Call(t, "POST", url+"/v1/completions", completion, nil)
	}
	after = h.UpstreamRequests()
	if after[addrs[0]] != before[addrs[0]] || after[addrs[1]] != before[addrs[1]] {
		t.Errorf("the refused older push's hosts got requests: %v -> %v", before, after)
	}
	// On a gateway with no state yet, an hour-old push is accepted, and stale.
	h2, url2 := startRouter(t, addrs, 1, `,"strategy":"round_robin","fallbacks":0,"state":{"token":"`+stateToken+`"}`)
	if code, body, _ := testenv.Call(t, "POST", url2+"/.kvroute/v1/state", old, map[string]string{"authorization": "Bearer " + stateToken}); code != 200 {
		t.Fatalf("old push to a fresh gateway: %d %s", code, body)
	}
	for i := 0; i < 4; i++ {
		testenv.Call(t, "POST", url2+"/v1/completions", completion, nil)
	}
	if got := h2.CounterValue("kvroute.router.stale_state"); got == 0 {
		t.Error("a push stamped an hour ago was not counted stale")
	}
}

// llamaCompletion is a completion for the model the simulated engines serve.
const llamaCompletion = `{"model":"llama-3-8b","prompt":"hello","max_tokens":2}`

// Stale pushed state (the metrics service down) keeps what it knew about
// health: the engine last pushed unhealthy and the dead one whose breaker
// opened get none of the requests while healthy engines remain.
func TestWasmStaleStateKeepsDeadHostsOut(t *testing.T) {
	f := startFleet(t, server.Options{Replicas: 3, TimeScale: 0, TimeScaleSet: true})
	dead := httptest.NewServer(http.NotFoundHandler())
	deadAddr := dead.Listener.Addr().String()
	dead.Close() // nothing listens there any more
	addrs := append(f.Addrs(), deadAddr)
	sick := addrs[1]
	h, url := startRouter(t, addrs, 1, `,"strategy":"round_robin","fallbacks":0,"circuitBreaker":{"consecutiveFailures":2,"cooldownMs":600000},"state":{"token":"`+stateToken+`","staleAfterMs":5000}`)
	// The gateway's first push, stamped a minute ago: accepted, and stale.
	push := fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[{"address":%q},{"address":%q,"healthy":false},{"address":%q},{"address":%q}]}`,
		time.Now().Add(-time.Minute).UnixMilli(), addrs[0], sick, addrs[2], deadAddr)
	if code, body, _ := testenv.Call(t, "POST", url+"/.kvroute/v1/state", push, map[string]string{"authorization": "Bearer " + stateToken}); code != 200 {
		t.Fatalf("push: %d %s", code, body)
	}
	failed := 0
	for i := 0; i < 8; i++ { // the dead engine fails twice: its breaker opens
		if code, _, _ := testenv.Call(t, "POST", url+"/v1/completions", llamaCompletion, nil); code != 200 {
			failed++
		}
	}
	if got := h.CounterValue("kvroute.router.breaker.opened"); got != 1 || failed != 2 {
		t.Fatalf("breaker.opened = %d after %d failures, want 1 after 2", got, failed)
	}
	if h.CounterValue("kvroute.router.stale_state") == 0 {
		t.Fatal("the pushed state is not stale")
	}
	before := h.UpstreamRequests()
	for i := 0; i < 30; i++ {
		if code, body, _ := testenv.Call(t, "POST", url+"/v1/completions", llamaCompletion, nil); code != 200 {
			t.Errorf("request %d: %d %s (went to the dead engine)", i, code, body)
		}
	}
	after := h.UpstreamRequests()
	if n := after[sick] - before[sick]; n != 0 {
		t.Errorf("the engine last pushed unhealthy got %d of 30 requests with stale state, want 0", n)
	}
	if n := after[addrs[0]] + after[addrs[2]] - before[addrs[0]] - before[addrs[2]]; n != 30 {
		t.Errorf("the healthy engines served %d of 30", n)
	}
}

// hostStore reads the host's shared data as an index.Store, to check the
// load counters from outside the VMs.
type hostStore struct{ h *wasmhost.Host }

func (s hostStore) Get(key string) ([]byte, uint32, error) {
	v, cas, ok := s.h.SharedData(key)
	if !ok {
		return nil, 0, index.ErrNotFound
	}
	return v, cas, nil
}

func (s hostStore) Set(key string, value []byte, cas uint32) error {
	return errors.New("read only")
}

func TestWasmLoadCountersSurviveResets(t *testing.T) {
	n := 10000
	if testing.Short() {
		n = 1000
	}
	f := startFleet(t, server.Options{Replicas: 4, TimeScale: 0.002})
	h, url := startRouter(t, f.Addrs(), 2, `,"fallbacks":1`)
	sendWithResets(t, url, n)
	waitLoadsZero(t, hostStore{h})
	if h.VMFailures() != 0 {
		t.Errorf("VM failures: %d", h.VMFailures())
	}
	if got := h.CounterValue("kvroute.router.recovered_panics"); got != 0 {
		t.Errorf("recovered_panics = %d", got)
	}
}

// sendWithResets sends n completions (streamed or not, at random) from 16
// clients, a third of them reset by the client at a random moment, and
// fails unless some completed and some were reset.
func sendWithResets(t *testing.T, url string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	jobs := make(chan int)
	var mu sync.Mutex
	outcomes := map[string]int{}
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed))
			for i := range jobs {
				stream := rng.Intn(2) == 0
				body := fmt.Sprintf(`{"model":"llama-3-8b","prompt":%q,"max_tokens":%d,"stream":%v}`, systemPrompt(i%5)+fmt.Sprint(i), 1+rng.Intn(32), stream)
				ctx, cancel := context.WithCancel(context.Background())
				if rng.Intn(3) == 0 { // client reset at a random moment
					time.AfterFunc(time.Duration(rng.Intn(3000))*time.Microsecond, cancel)
				}
				req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", strings.NewReader(body))
				resp, err := testenv.Client.Do(req)
				outcome := "reset"
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil {
						outcome = fmt.Sprint(resp.StatusCode)
					}
				}
				cancel()
				mu.Lock()
				outcomes[outcome]++
				mu.Unlock()
			}
		}(int64(w))
	}
	for i := 0; i < n; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	t.Logf("%d requests: %v", n, outcomes)
	if outcomes["reset"] == 0 || outcomes["200"] == 0 {
		t.Fatalf("the test needs both completed and reset requests: %v", outcomes)
	}
}

// waitLoadsZero fails unless every host's shared load counters (read
// through store) are back to zero within 10 s.
func waitLoadsZero(t *testing.T, store index.Store) {
	t.Helper()
	ix, err := index.New(store, index.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// Loads reports the slots the index last read; a query reads them.
	var m index.Matches
	if err := ix.Query(nil, &m); err != nil {
		t.Fatal(err)
	}
	if ix.Slots() == 0 {
		t.Fatal("the shared index holds no host slots: nothing to check")
	}
	var leaked []index.Load
	if !testenv.Poll(testenv.WaitTimeout, func() bool {
		leaked = leaked[:0]
		for _, l := range ix.Loads(nil) {
			if l != (index.Load{}) {
				leaked = append(leaked, l)
			}
		}
		return len(leaked) == 0
	}) {
		t.Fatalf("load counters did not return to zero: %+v", leaked)
	}
}

// The bad-input table through the real module: the documented status for
// each, and both VMs healthy afterwards.
func TestWasmBadInputs(t *testing.T) {
	f := startFleet(t, server.Options{Replicas: 2, TimeScale: 0, TimeScaleSet: true, Model: "m"})
	h, url := startRouter(t, f.Addrs(), 2, `,"maxBodyBytes":4096`)
	total := func() int {
		n := 0
		for _, c := range h.UpstreamRequests() {
			n += c
		}
		return n
	}
	for _, tc := range badInputs {
		before := total()
		var body io.Reader = strings.NewReader(tc.body)
		if tc.chunks > 1 { // no length: the client sends Transfer-Encoding: chunked
			body = io.MultiReader(strings.NewReader(tc.body))
		}
		if tc.body == "" {
			body = http.NoBody
		}
		req, _ := http.NewRequest(tc.method, url+tc.path, body)
		req.Header.Set("content-type", "application/json")
		resp, err := testenv.Client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		reached := total() - before
		if tc.status == 0 {
			// Routed: it reached an engine (whatever the engine answers:
			// the simulator has no embeddings endpoint).
			if reached != 1 {
				t.Errorf("%s: want it routed to an engine, got %d %s (%d upstream requests)", tc.name, resp.StatusCode, b, reached)
			}
			continue
		}
		if resp.StatusCode != tc.status || reached != 0 {
			t.Errorf("%s: %d %s (%d upstream requests), want %d from the filter", tc.name, resp.StatusCode, b, reached, tc.status)
			continue
		}
		if gjson.GetBytes(b, "error.type").String() != "invalid_request_error" {
			t.Errorf("%s: not an OpenAI-style error: %s", tc.name, b)
		}
	}
	for _, w := range h.Workers() {
		if w.Failed {
			t.Errorf("worker %d failed", w.Index)
		}
	}
	if code, body, _ := testenv.Call(t, "POST", url+"/v1/completions", `{"model":"m","prompt":"still alive?","max_tokens":2}`, nil); code != 200 {
		t.Errorf("after the bad inputs: %d %s", code, body)
	}
	if h.VMFailures() != 0 {
		t.Errorf("VM failures: %d", h.VMFailures())
	}
}

// A dead engine (connection refused): override_host moves on to the next
// address in the destination header; the filter sees another upstream
// answer, counts a fallback and a failure of the primary, and after
// consecutiveFailures stops choosing the dead engine.
func TestWasmDeadEngineOpensTheBreaker(t *testing.T) {
	f := startFleet(t, server.Options{Replicas: 2, TimeScale: 0, TimeScaleSet: true})
	dead := httptest.NewServer(http.NotFoundHandler())
	deadAddr := dead.Listener.Addr().String()
	dead.Close() // nothing listens there any more
	addrs := append([]string{deadAddr}, f.Addrs()...)
	h, url := startRouter(t, addrs, 1, `,"strategy":"round_robin","fallbacks":2,"circuitBreaker":{"consecutiveFailures":2,"cooldownMs":600000}`)
	for i := 0; i < 12; i++ {
		if code, body, _ := testenv.Call(t, "POST", url+"/v1/completions", `{"model":"llama-3-8b","prompt":"hello","max_tokens":2}`, nil); code != 200 {
			t.Fatalf("request %d: %d %s (a fallback should have served it)", i, code, body)
		}
	}
	if got := h.CounterValue("kvroute.router.fallbacks_used"); got != 2 {
		t.Errorf("fallbacks_used = %d, want 2 (then the breaker keeps the dead engine out)", got)
	}
	if got := h.CounterValue("kvroute.router.breaker.opened"); got != 1 {
		t.Errorf("breaker.opened = %d, want 1", got)
	}
	if n := h.UpstreamRequests()[deadAddr]; n != 0 {
		t.Errorf("the dead engine is counted as serving %d requests", n)
	}
}

// With orca on, the filter asks the engine for endpoint-load-metrics (the
// engine answers with it); off, it does not.
func TestWasmORCARequested(t *testing.T) {
	f := startFleet(t, server.Options{Replicas: 2, TimeScale: 0, TimeScaleSet: true})
	for _, on := range []bool{true, false} {
		_, url := startRouter(t, f.Addrs(), 1, fmt.Sprintf(`,"orca":%v`, on))
		code, body, hdr := testenv.Call(t, "POST", url+"/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":2}`, nil)
		if code != 200 {
			t.Fatalf("%d %s", code, body)
		}
		got := hdr.Get("endpoint-load-metrics")
		if on != strings.HasPrefix(got, "TEXT ") {
			t.Errorf("orca=%v: engine's endpoint-load-metrics = %q", on, got)
		}
	}
}

func TestWasmClientPDFieldsNeverReachTheEngine(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, string(b))
		mu.Unlock()
		io.WriteString(w, `{"choices":[]}`)
	}))
	defer up.Close()
	_, url := startRouter(t, []string{up.Listener.Addr().String()}, 1, `,"fallbacks":0`)
	body := `{"model":"m","prompt":"x","kv_transfer_params":{"remote_host":"169.254.169.254"},"bootstrap_host":"169.254.169.254"}`
	if code, b, _ := testenv.Call(t, "POST", url+"/v1/completions", body, nil); code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || strings.Contains(seen[0], "169.254") || gjson.Get(seen[0], "prompt").Str != "x" {
		t.Errorf("engine received %q", seen)
	}
}

// Session affinity by the body's "user" holds in the module across bodies of
// other sizes read into the router's one reused buffer (see readBuffer), with
// the user at a different place in each body: each user still reaches the
// engine it was pinned to.
func TestWasmBodyUserPinsAcrossReusedBodies(t *testing.T) {
	f := startFleet(t, server.Options{Replicas: 4, TimeScale: 0, TimeScaleSet: true})
	h, url := startRouter(t, f.Addrs(), 1, `,"strategy":"sticky_session","fallbacks":0`)
	served := func(user string, size int) string {
		// "user" after the prompt: where it sits in the buffer varies.
		body := fmt.Sprintf(`{"model":"llama-3-8b","messages":[{"role":"user","content":%q}],"max_tokens":4,"user":%q}`,
			strings.Repeat("padding text ", size), user)
		return servedBy(t, h, url, body, nil)
	}
	pinned := map[string]string{}
	for i := 0; i < 8; i++ {
		user := fmt.Sprintf("user-%02d", i)
		pinned[user] = served(user, 10+i)
	}
	for i := 0; i < 16; i++ { // other users, larger bodies: the buffer is rewritten
		served(fmt.Sprintf("zz-other-%02d", i), 200+50*i)
	}
	for user, want := range pinned {
		if got := served(user, 5); got != want {
			t.Errorf("%s went to %s, pinned to %s", user, got, want)
		}
	}
}

// One gateway is one router whatever its worker count: with 2 workers, each
// conversation's turns handed to the workers in turn and nothing but the
// session to keep them together (sticky_session, a different prompt each
// turn), every follow-up reaches the host its session was pinned to,
// because the pins live in shared data (per-worker tables sent about half
// of them elsewhere).
func TestWasmSessionsHoldAcrossWorkers(t *testing.T) {
	f := startFleet(t, server.Options{Replicas: 4, TimeScale: 0, TimeScaleSet: true})
	h, url := startRouter(t, f.Addrs(), 2, `,"strategy":"sticky_session"`)
	served := func(session string, turn int) string {
		body := chatBody(systemPrompt(turn), fmt.Sprintf("turn %d of %s: what next?", turn, session))
		return servedBy(t, h, url, body, map[string]string{"x-session-id": session})
	}
	first := map[string]string{}
	hosts := map[string]bool{}
	for i := range 20 {
		s := fmt.Sprintf("conv-%02d", i)
		first[s] = served(s, 0)
		hosts[first[s]] = true
	}
	moved, followUps := 0, 0
	for turn := 1; turn <= 3; turn++ {
		// One request without a session first: each round's turns then
		// reach the other worker than the round before.
		if code, b, _ := testenv.Call(t, "POST", url+"/v1/chat/completions", chatBody(systemPrompt(9), "hello"), nil); code != 200 {
			t.Fatalf("%d %s", code, b)
		}
		for i := range 20 {
			s := fmt.Sprintf("conv-%02d", i)
			followUps++
			if served(s, turn) != first[s] {
				moved++
			}
		}
	}
	t.Logf("%d of %d follow-ups left their session's host; first turns on %d hosts", moved, followUps, len(hosts))
	if moved*20 > followUps {
		t.Fatalf("%d of %d follow-ups left their session's host (at most 5%% may)", moved, followUps)
	}
	pins := 0
	for _, k := range h.SharedDataKeys() {
		if strings.HasPrefix(k, "kvroute/sess/") {
			pins++
		}
	}
	if pins == 0 {
		t.Fatal("no session pin in shared data")
	}
}

// A response's feedback counters are in place before the response is
// counted (feedback.responses goes last): a reader that sees the count
// move, however soon, reads that response's cached tokens too. Every
// response here confirms the same number of cached tokens, so a reader
// that reads the count and then the tokens must find at least that many
// per response counted. A reader spinning while 500 requests go through
// caught the module mid-update a few times per run when the count went
// first.
func TestWasmResponseCountedAfterItsFeedback(t *testing.T) {
	const cached = 7
	addrs := jsonUpstreams(t, 2, fmt.Sprintf(`{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":%d}}}`, cached))
	h, url := startRouter(t, addrs, 1, `,"fallbacks":0`)
	const responses, confirmed = "kvroute.router.feedback.responses", "kvroute.router.confirmed_cached_tokens"
	stop := make(chan struct{})
	torn := make(chan string, 1)
	go func() {
		defer close(torn)
		for {
			select {
			case <-stop:
				return
			default:
			}
			n := h.CounterValue(responses) // the count first, then what it covers
			if c := h.CounterValue(confirmed); c < cached*n {
				torn <- fmt.Sprintf("%d responses counted with %d confirmed cached tokens, want %d", n, c, cached*n)
				return
			}
		}
	}()
	const requests = 500
	for i := range requests {
		body := fmt.Sprintf(`{"model":"m","prompt":"question %d","max_tokens":2}`, i)
		if code, r, _ := testenv.Call(t, "POST", url+"/v1/completions", body, nil); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, r)
		}
	}
	testenv.WaitFor(t, "every response counted", func() bool { return h.CounterValue(responses) == requests })
	close(stop)
	if msg, ok := <-torn; ok {
		t.Errorf("a reader saw a response counted before its cached tokens: %s", msg)
	}
	if c := h.CounterValue(confirmed); c != cached*requests {
		t.Errorf("confirmed cached tokens %d, want %d", c, cached*requests)
	}
}
