package filter

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/wasmhosttest"
	"github.com/kvroute/kvroute/openai"
)

// Precise cache state turns the capacity model into a backstop at twice
// the engine's KV for a host, and only while the pushed state is fresh
// (snapshot.Host.PreciseCacheState). One engine whose KV capacity holds
// one and a half of three prompts of one size, A, B and D (and C, twice
// their size), recorded in recency buckets 1 s apart:
//   - without precise cache state, recording B and D ages A out (A is
//     predicted nothing: the index keeps or drops a bucket whole, and
//     drops it when less than half of it fits);
//   - with it, recording B leaves A predicted whole: the engine's
//     removals, not the capacity, say what it evicted; past twice the
//     capacity (C, twice A's size, after B and A) the oldest, B, goes;
//   - once the pushed state is stale (the metrics service down), the
//     capacity model is back: recording C, more than the capacity, ages
//     B out, which the precise mode would keep; state.precise_dropped
//     counts the fallback.
//
// The proxy's clock is a testenv.Clock the test moves: the buckets
// and the staleness are the proxy's time, so they pass at once and
// exactly, however loaded the machine.
func TestWasmPreciseCacheStateReplacesCapacityModel(t *testing.T) {
	promptA := strings.Repeat("a quick brown fox jumps over the lazy dog ", 100)
	promptB := strings.Repeat("b quick brown fox jumps over the lazy dog ", 100)
	promptD := strings.Repeat("d quick brown fox jumps over the lazy dog ", 100)
	promptC := strings.Repeat("c quick brown fox jumps over the lazy dog ", 200)
	n := len(promptA) / 4
	// The engine confirms every prompt whole: never fewer tokens than
	// predicted, so cached_tokens corrects nothing here.
	resp := fmt.Sprintf(`{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`, n, n)
	addrs := jsonUpstreams(t, 1, resp)
	const staleMs = 5000
	clock := testenv.NewClock(time.Now())
	h, url := startRouterClock(t, addrs, 1, fmt.Sprintf(`{%s,"fallbacks":0,"strategy":"kv_cache_aware","state":{"token":%q,"staleAfterMs":%d}}`,
		endpointsJSON(addrs), stateToken, staleMs), clock)
	auth := map[string]string{"authorization": "Bearer " + stateToken}
	// 16-token blocks x 105: 1,680 tokens of KV; A, B and D are about
	// 1,050 tokens each, C 2,100.
	push := func(precise bool) time.Time {
		t.Helper()
		now := clock.Advance(time.Millisecond) // a newer stamp than the state in force
		st := fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[{"address":%q,"blockSize":16,"numGpuBlocks":105,"preciseCacheState":%t}]}`,
			now.UnixMilli(), addrs[0], precise)
		if code, r, _ := testenv.Call(t, "POST", url+"/.kvroute/v1/state", st, auth); code != 200 {
			t.Fatalf("push: %d %s", code, r)
		}
		return now
	}
	predicted := func(prompt string) int64 {
		t.Helper()
		got, _ := predictedCached(t, h, url, `{"model":"m","prompt":"`+prompt+`","max_tokens":2}`)
		return got
	}
	bucket := func() { clock.Advance(1100 * time.Millisecond) } // the index's recency buckets are 1 s

	push(false)
	predicted(promptA)
	bucket()
	predicted(promptB)
	predicted(promptD)
	if got := predicted(promptA); got > int64(n)/2 {
		t.Fatalf("capacity model: after B and D, A predicted %d cached tokens; want it aged out (the capacity holds %d of A's, B's and D's %d)", got, 1680, 3*n)
	}

	// Three buckets (3.3 s of the proxy's time) pass below while the state
	// pushed now stays fresh (staleAfterMs 5 s).
	pushedAt := push(true)
	bucket()
	predicted(promptB)
	bucket()
	whole := predicted(promptA)
	if whole < int64(n)*3/4 {
		t.Fatalf("precise cache state: after B, A predicted %d cached tokens; want about %d (no capacity model)", whole, n)
	}
	bucket()
	predicted(promptC) // D, B, A and C: twice the capacity and more
	if got := predicted(promptB); got > int64(n)/2 {
		t.Fatalf("precise cache state: after D, B, A and C (%d tokens, over twice the capacity), B predicted %d cached tokens; want it aged out by the backstop", 5*n, got)
	}

	// Just past staleAfterMs since the push:
	clock.Advance(pushedAt.Add(staleMs*time.Millisecond + time.Millisecond).Sub(clock.Now()))
	// Stale: the capacity model is back. C alone is more than the
	// capacity, so C's record ages B out; the precise mode would keep B,
	// C and B being under twice the capacity.
	predicted(promptB)
	bucket()
	predicted(promptC)
	if got := predicted(promptB); got > int64(n)/2 {
		t.Fatalf("stale state: after C (%d tokens, more than the capacity), B predicted %d cached tokens; want it aged out by the capacity model again", 2*n, got)
	}
	if v := h.CounterValue("kvroute.router.state.precise_dropped"); v != 1 {
		t.Errorf("state.precise_dropped = %d, want 1", v)
	}
}

// A pulling gateway (state.pull) applies the routes and removals a pull
// carries, as a pushed gateway does a push's, and asks the next pull from
// the cursor the state came with: another gateway's route marks the chain
// on engine 0, a later pull's removal cuts it, and that pull asked
// since=<the first pull's cursor>.
func TestWasmPulledStateCarriesRoutesAndRemovals(t *testing.T) {
	prompt := strings.Repeat("the quick brown fox jumps over the lazy dog ", 100)
	body := `{"model":"m","prompt":"` + prompt + `","max_tokens":2}`
	n := len(prompt) / 4
	resp := fmt.Sprintf(`{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`, n, n)
	addrs := jsonUpstreams(t, 2, resp)
	chain := newParser(t, `{}`)
	if _, err := chain.Parse([]byte(body), openai.Completions); err != nil {
		t.Fatal(err.Message)
	}
	b64 := chainBase64(chain.Hasher().Blocks())

	var mu sync.Mutex
	var asked []string
	state := ""
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, r.URL.RawQuery)
		io.WriteString(w, state)
	}))
	t.Cleanup(metrics.Close)
	// The proxy's clock, which the pull interval is kept in, moves when
	// the test says.
	clock := testenv.NewClock(time.Now())
	serve := func(extra string) {
		now := clock.Advance(time.Millisecond) // a newer stamp than the state in force
		mu.Lock()
		defer mu.Unlock()
		state = fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[{"address":%q},{"address":%q}]%s}`, now.UnixMilli(), addrs[0], addrs[1], extra)
		asked = asked[:0]
	}
	h, url := wasmhosttest.Start(t, wasmhost.Config{
		Module: testenv.Module(t), VMID: "kvroute", Workers: 1, Dispatch: wasmhost.DispatchStream,
		Filters: []wasmhost.Filter{{RootID: RootRouter, AllowOnHeadersStopIteration: true, Configuration: `{` + endpointsJSON(addrs) +
			`,"strategy":"kv_cache_aware","fallbacks":0,"state":{"token":"` + stateToken + `","pull":{"cluster":"kvroute_metrics","intervalMs":100}}}`}},
		Clusters:     map[string][]string{"engines": addrs, "kvroute_metrics": {metrics.Listener.Addr().String()}},
		RouteCluster: "engines",
		Clock:        clock.Now,
	})
	pull := func() {
		t.Helper()
		before := h.CounterValue("kvroute.router.state.pulls")
		clock.Advance(110 * time.Millisecond) // the pull interval
		h.FireTicks()
		testenv.WaitFor(t, "a pulled state stored", func() bool { return h.CounterValue("kvroute.router.state.pulls") > before })
	}
	predicted := func() (int64, string) { t.Helper(); return predictedCached(t, h, url, body) }

	serve(fmt.Sprintf(`,"cursor":"svc1.7","gateways":[{"gateway":"other","timestampMs":%d,"routes":[{"address":%q,"chain":%q,"promptTokens":%d}]}]`,
		clock.Now().UnixMilli(), addrs[0], b64, n))
	pull()
	whole, to := predicted()
	if to != addrs[0] || whole <= 0 {
		t.Fatalf("after a pull carrying another gateway's route to engine 0: served by %s, predicted %d cached tokens; want engine 0, > 0", to, whole)
	}

	serve(fmt.Sprintf(`,"cursor":"svc1.9","removals":[{"address":%q,"from":0,"chain":%q}]`, addrs[0], b64))
	pull()
	mu.Lock()
	q := slices.Clone(asked)
	mu.Unlock()
	if len(q) == 0 || q[0] != "since=svc1.7" {
		t.Errorf("the pull after a state with cursor svc1.7 asked %q, want since=svc1.7", q)
	}
	if v := h.CounterValue("kvroute.router.state.removals_applied"); v != 1 {
		t.Errorf("state.removals_applied = %d after a pull carrying one removal, want 1", v)
	}
	if none, _ := predicted(); none != 0 {
		t.Fatalf("after a pull carrying engine 0's eviction of the whole chain: predicted %d cached tokens, want 0", none)
	}
}

// predictedCached sends body to url's completions path and returns the
// cached tokens the index predicted for the host that served it (counted
// once the response's feedback is: the stream ends after the reply) and
// that host's address.
func predictedCached(t *testing.T, h *wasmhost.Host, url, body string) (int64, string) {
	t.Helper()
	before := h.CounterValue("kvroute.router.feedback.predicted_cached_tokens")
	responses := h.CounterValue("kvroute.router.feedback.responses")
	served := h.UpstreamRequests()
	if code, r, _ := testenv.Call(t, "POST", url+"/v1/completions", body, nil); code != 200 {
		t.Fatalf("request: %d %s", code, r)
	}
	var to string
	for a, c := range h.UpstreamRequests() {
		if c > served[a] {
			to = a
		}
	}
	testenv.WaitFor(t, "the response's feedback", func() bool { return h.CounterValue("kvroute.router.feedback.responses") > responses })
	return h.CounterValue("kvroute.router.feedback.predicted_cached_tokens") - before, to
}

// chainBase64 is a chain as snapshots carry it: 8-byte little-endian
// hashes, base64.
func chainBase64(c []uint64) string {
	var raw []byte
	for _, x := range c {
		raw = binary.LittleEndian.AppendUint64(raw, x)
	}
	return base64.StdEncoding.EncodeToString(raw)
}

// A gateway's routing report carries, with each route, the worker's
// calibrated characters per token for the request's model (learned from
// the engines' usage.prompt_tokens), which the service's bridge converts
// engine tokens with: none before the first response, about 8 after an
// engine counted a prompt of 8 characters a token.
func TestWasmReportCarriesCalibratedCharsPerToken(t *testing.T) {
	prompt := strings.Repeat("the quick brown fox jumps over the lazy dog ", 40)
	resp := fmt.Sprintf(`{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":%d,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}`, len(prompt)/8)
	addrs := jsonUpstreams(t, 1, resp)
	var mu sync.Mutex
	var cpts []float64
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var rep struct {
			Routes []struct {
				CharsPerToken float64 `json:"charsPerToken"`
			} `json:"routes"`
		}
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &rep); err != nil {
			t.Errorf("report %s: %v", b, err)
		}
		mu.Lock()
		for _, rt := range rep.Routes {
			cpts = append(cpts, rt.CharsPerToken)
		}
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(metrics.Close)
	clock := testenv.NewClock(time.Now()) // the report interval is the proxy's time
	h, url := wasmhosttest.Start(t, wasmhost.Config{
		Module: testenv.Module(t), VMID: "kvroute", Workers: 1, Dispatch: wasmhost.DispatchStream,
		Filters: []wasmhost.Filter{{RootID: RootRouter, AllowOnHeadersStopIteration: true, Configuration: `{` + endpointsJSON(addrs) +
			`,"fallbacks":0,"state":{"token":"` + stateToken + `","report":{"cluster":"kvroute_metrics","intervalMs":100}}}`}},
		Clusters:     map[string][]string{"engines": addrs, "kvroute_metrics": {metrics.Listener.Addr().String()}},
		RouteCluster: "engines",
		Clock:        clock.Now,
	})
	body := `{"model":"m","prompt":"` + prompt + `","max_tokens":1}`
	for i := range 2 {
		responses := h.CounterValue("kvroute.router.feedback.responses")
		if code, r, _ := testenv.Call(t, "POST", url+"/v1/completions", body, nil); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, r)
		}
		testenv.WaitFor(t, "the response's usage", func() bool { return h.CounterValue("kvroute.router.feedback.responses") > responses })
	}
	testenv.WaitFor(t, "both routes reported", func() bool {
		clock.Advance(110 * time.Millisecond) // a report is due
		h.FireTicks()
		mu.Lock()
		defer mu.Unlock()
		return len(cpts) >= 2
	})
	mu.Lock()
	defer mu.Unlock()
	if cpts[0] != 0 || cpts[1] < 7.5 || cpts[1] > 9 {
		t.Errorf("routes reported with characters per token %v; want none before the first response, about 8 after it", cpts)
	}
}
