package filter

// Wasm tests of admission in kvroute.router: the built module in
// internal/sim/wasmhost in front of one engine that answers when the test
// lets it. A pending-prefill threshold of one token makes "saturated" mean
// "a request is in flight", so holding is deterministic, and the test, not
// the machine's speed, decides how long the engine stays busy.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/kvroute/kvroute/filter/statnames"
	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/wasmhosttest"
)

// admissionModule is dist/kvroute.wasm, or KVROUTE_TEST_WASM when set (a
// private build, so testing does not race others rebuilding dist/).
func admissionModule(t testing.TB) []byte {
	if p := os.Getenv("KVROUTE_TEST_WASM"); p != "" {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	return testenv.Module(t)
}

// operatorHeaders names the priority and deadline headers in the admission
// configuration: the tests that send them play the operator's Envoy, which
// sets them.
const operatorHeaders = `,"priorityHeader":"` + PriorityHeader + `","deadlineHeader":"` + DeadlineHeader + `"`

// startAdmissionAt starts the router with admission on in front of the
// engines at addrs: every request is held while any prompt token is
// pending on them.
func startAdmissionAt(t *testing.T, workers int, addrs []string, admission string) (*wasmhost.Host, string) {
	t.Helper()
	return wasmhosttest.Start(t, wasmhost.Config{
		Module: admissionModule(t), VMID: "kvroute", Workers: workers, Dispatch: wasmhost.DispatchStream,
		Filters: []wasmhost.Filter{{RootID: RootRouter, AllowOnHeadersStopIteration: true,
			Configuration: "{" + endpointsJSON(addrs) + `,"fallbacks":0,"admission":{"maxWaiting":0,"maxKvUsage":0,"maxPendingPrefillTokens":1` + admission + "}}"}},
		Clusters: map[string][]string{"engines": addrs}, RouteCluster: "engines",
	})
}

func admCompletion(i, maxTokens int) string {
	return fmt.Sprintf(`{"model":"llama-3-8b","prompt":%q,"max_tokens":%d}`, systemPrompt(i)+"question", maxTokens)
}

func noLeakedLoad(t *testing.T, h *wasmhost.Host) {
	t.Helper()
	waitLoadsZero(t, hostStore{h})
	for _, band := range []string{"batch", "standard", "interactive"} {
		if v := h.CounterValue(statnames.Tagged(statnames.Admission, statnames.TagBand, band, "held")); v != 0 {
			t.Errorf("held.%s gauge = %d after every request ended", band, v)
		}
	}
	if h.VMFailures() != 0 || h.CounterValue("kvroute.router.recovered_panics") != 0 {
		t.Errorf("VM failures %d, recovered panics %d", h.VMFailures(), h.CounterValue("kvroute.router.recovered_panics"))
	}
}

// With one worker the queue is global: every request held behind the first
// is released to the engine, interactive ones first. With two workers each
// holds its own queue: every request is still released, order holds only
// per worker.
func TestWasmAdmissionHeldRequestsResumeInPriorityOrder(t *testing.T) {
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprint(workers, "workers"), func(t *testing.T) { heldRequestsResume(t, workers) })
	}
}

// gatedEngine answers every completion at once but the first, which it
// holds until open is called, and notes the order requests reach it by
// their prompt's index (admCompletion's i; -1 when unreadable).
func gatedEngine(t *testing.T) (addr string, open func(), arrivals func() []int) {
	t.Helper()
	gate := make(chan struct{})
	var mu sync.Mutex
	var seen []int
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		i := -1
		fmt.Sscanf(gjson.GetBytes(body, "prompt").String(), "System prompt %d.", &i)
		mu.Lock()
		first := len(seen) == 0
		seen = append(seen, i)
		mu.Unlock()
		if first {
			<-gate
		}
		w.Header().Set("content-type", "application/json")
		io.WriteString(w, benchCompletion)
	}))
	var once sync.Once
	open = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(func() { open(); up.Close() })
	arrivals = func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
	return up.Listener.Addr().String(), open, arrivals
}

func heldRequestsResume(t *testing.T, workers int) {
	// The first request holds the engine until every other one is held,
	// however long sending them takes; then each is released only once the
	// one before it has its answer (a pending prompt token saturates), so
	// the order they reach the engine is the order of release.
	engine, open, arrivals := gatedEngine(t)
	h, url := startAdmissionAt(t, workers, []string{engine}, `,"maxHeld":16`+operatorHeaders)
	const n = 8
	prio := func(i int) string {
		if i%2 == 1 {
			return "interactive"
		}
		return "batch"
	}
	var wg sync.WaitGroup
	call := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, body, _ := testenv.Call(t, "POST", url+"/v1/completions", admCompletion(i, 8), map[string]string{PriorityHeader: prio(i)})
			if code != 200 || gjson.Get(body, "choices.0.text").String() == "" {
				t.Errorf("request %d (%s): %d %s", i, prio(i), code, body)
			}
		}()
	}
	call(0)
	testenv.WaitFor(t, "the first request at the engine", func() bool { return len(arrivals()) == 1 })
	heldTotal := func() int64 {
		return h.CounterValue(statnames.Tagged(statnames.Admission, statnames.TagBand, "batch", "held_total")) + h.CounterValue(statnames.Tagged(statnames.Admission, statnames.TagBand, "interactive", "held_total"))
	}
	// One at a time, so that they are held in a known order (batch and
	// interactive alternating): a queue that released them as they came
	// would fail the order check every time.
	for i := 1; i < n; i++ {
		call(i)
		testenv.WaitFor(t, fmt.Sprintf("request %d held", i), func() bool { return heldTotal() == int64(i) })
	}
	open()
	wg.Wait()
	var order []string
	for _, i := range arrivals() {
		order = append(order, prio(i))
	}
	held, released := heldTotal(), h.CounterValue(statnames.Admission+"released")
	t.Logf("order at the engine %v; held %d, released %d", order, held, released)
	if held != n-1 || released != held {
		t.Fatalf("held %d, released %d: want %d held and every one released", held, released, n-1)
	}
	if m, ok := h.Metric(statnames.Admission + "wait_us"); !ok || int64(len(m.Samples)) != held {
		t.Errorf("wait_us histogram has %d samples, want one per held request (%d)", len(m.Samples), held)
	}
	if len(order) != n {
		t.Errorf("the engine saw %d requests (%v), want %d", len(order), arrivals(), n)
	}
	if want := "[batch interactive interactive interactive interactive batch batch batch]"; workers == 1 && fmt.Sprint(order) != want {
		t.Errorf("order at the engine %v, want %s (held interactive before held batch)", order, want)
	}
	noLeakedLoad(t, h)
}

func TestWasmAdmissionDeadlineExpiryOverflowShedAndDisconnect(t *testing.T) {
	// The engine answers only once the test releases it, so it stays busy
	// through every step below however slow the machine: a held request
	// leaves the queue by its deadline, its client going away or a shed,
	// never because the engine freed up.
	engine, release := blockingUpstream(t)
	h, url := startAdmissionAt(t, 1, []string{engine}, `,"maxHeld":1,"retryAfterS":3`+operatorHeaders)
	// Occupy the engine.
	busy := make(chan int, 1)
	go func() {
		code, _, _ := testenv.Call(t, "POST", url+"/v1/completions", admCompletion(0, 60), nil)
		busy <- code
	}()
	testenv.WaitFor(t, "the engine busy", func() bool { return h.CounterValue("kvroute.router.requests.routed") >= 1 })

	// Deadline expiry: 429, Retry-After, an OpenAI error body. With the
	// engine held, only the tick's expiry on the filter's clock can answer
	// it (the counters say which path did); a slow machine only makes the
	// wait longer, so the lower bound holds and no upper bound is needed.
	start := time.Now()
	code, body, hdr := testenv.Call(t, "POST", url+"/v1/completions", admCompletion(1, 4), map[string]string{DeadlineHeader: "50"})
	if code != 429 || hdr.Get("retry-after") != "3" || gjson.Get(body, "error.type").String() != "rate_limit_exceeded" || gjson.Get(body, "error.code").Int() != 429 {
		t.Fatalf("expired request: %d retry-after %q %s", code, hdr.Get("retry-after"), body)
	}
	if d := time.Since(start); d < 49*time.Millisecond {
		t.Errorf("expiry answered after %v, before the 50 ms deadline (whole milliseconds on the filter's clock)", d)
	}
	if got := [2]int64{h.CounterValue(statnames.Admission + "expired"), h.CounterValue(statnames.Admission + "released")}; got != [2]int64{1, 0} {
		t.Errorf("expired, released = %v, want [1 0]", got)
	}
	if m, ok := h.Metric(statnames.Admission + "wait_us"); !ok || len(m.Samples) != 1 {
		t.Errorf("wait_us has %d samples, want the expired request's", len(m.Samples))
	}

	// Disconnect while held frees the place.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", strings.NewReader(admCompletion(2, 4)))
	gone := make(chan error, 1)
	go func() {
		resp, err := testenv.Client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		gone <- err
	}()
	testenv.WaitFor(t, "the request held", func() bool {
		return h.CounterValue(statnames.Tagged(statnames.Admission, statnames.TagBand, "standard", "held")) == 1
	})
	cancel()
	<-gone
	// The counter and the gauge move in two host calls of one callback:
	// wait for both rather than read the gauge between them.
	testenv.WaitFor(t, "the held request cancelled and its place freed", func() bool {
		return h.CounterValue(statnames.Admission+"cancelled") == 1 && h.CounterValue(statnames.Tagged(statnames.Admission, statnames.TagBand, "standard", "held")) == 0
	})

	// The freed place holds a batch request; an interactive one sheds it;
	// a second batch request overflows at once.
	shed := make(chan int, 1)
	go func() {
		code, body, hdr := testenv.Call(t, "POST", url+"/v1/completions", admCompletion(3, 4), map[string]string{PriorityHeader: "batch"})
		if code == 429 && hdr.Get("retry-after") == "" {
			t.Errorf("shed reply without Retry-After: %s", body)
		}
		shed <- code
	}()
	testenv.WaitFor(t, "the batch request held", func() bool {
		return h.CounterValue(statnames.Tagged(statnames.Admission, statnames.TagBand, "batch", "held")) == 1
	})
	inter := make(chan int, 1)
	go func() {
		code, _, _ := testenv.Call(t, "POST", url+"/v1/completions", admCompletion(4, 4), map[string]string{PriorityHeader: "interactive"})
		inter <- code
	}()
	if c := <-shed; c != 429 {
		t.Fatalf("held batch request displaced by an interactive one: got %d, want 429", c)
	}
	code, body, hdr = testenv.Call(t, "POST", url+"/v1/completions", admCompletion(5, 4), map[string]string{PriorityHeader: "batch"})
	if code != 429 || hdr.Get("retry-after") != "3" {
		t.Fatalf("overflow: %d %s", code, body)
	}
	release()
	if c := <-busy; c != 200 {
		t.Fatalf("the request that held the engine: %d", c)
	}
	if c := <-inter; c != 200 {
		t.Fatalf("the held interactive request: %d", c)
	}
	if got := [3]int64{h.CounterValue(statnames.Admission + "shed"), h.CounterValue(statnames.Admission + "overflow"), h.CounterValue(statnames.Admission + "released")}; got != [3]int64{1, 1, 1} {
		t.Errorf("shed, overflow, released = %v, want [1 1 1]", got)
	}
	// A malformed priority is the client's error.
	if code, body, _ := testenv.Call(t, "POST", url+"/v1/completions", admCompletion(6, 4), map[string]string{PriorityHeader: "urgent"}); code != 400 || !strings.Contains(body, PriorityHeader) {
		t.Errorf("bad priority header: %d %s", code, body)
	}
	noLeakedLoad(t, h)
}

// BenchmarkAdmissionInWasm measures what admission adds to a request that
// is admitted at once (the common case: an engine has room): the same
// filter with and without the "admission" key, 16 hosts, in the same run,
// alternately. vm-body-us is the median of the body callback (parse, hash,
// the admission check, decision), as the VM records it.
func BenchmarkAdmissionInWasm(b *testing.B) {
	module := admissionModule(b)
	var addrs []string
	for i := 0; i < 16; i++ {
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("content-type", "application/json")
			_, _ = w.Write([]byte(`{"id":"cmpl-1","choices":[{"text":"ok"}],"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":0}}}`))
		}))
		b.Cleanup(up.Close)
		addrs = append(addrs, up.Listener.Addr().String())
	}
	start := func(extra string) (string, *wasmhost.Host) {
		h, url := wasmhosttest.Start(b, wasmhost.Config{Module: module, VMID: "kvroute", Clusters: map[string][]string{"engines": addrs}, RouteCluster: "engines",
			Filters: []wasmhost.Filter{{RootID: RootRouter, AllowOnHeadersStopIteration: true, Configuration: "{" + endpointsJSON(addrs) + extra + "}"}}})
		return url, h
	}
	offURL, offHost := start("")
	onURL, onHost := start(`,"admission":{}`)
	median := func(h *wasmhost.Host, skip int) float64 {
		m, _ := h.Metric("kvroute.router.request_body_us")
		s := append([]uint64(nil), m.Samples[skip:]...)
		if len(s) == 0 {
			return 0
		}
		for i := 1; i < len(s); i++ {
			for j := i; j > 0 && s[j] < s[j-1]; j-- {
				s[j], s[j-1] = s[j-1], s[j]
			}
		}
		return float64(s[len(s)/2])
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: 20 * time.Second}
	system := strings.Repeat("You are a careful assistant for the kvroute benchmark. ", 4096/55)
	send := func(url string, i int) {
		resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(system, fmt.Sprint("question ", i))))
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	for i := 0; i < 20; i++ {
		send(offURL, i)
		send(onURL, i)
	}
	skipOff, _ := offHost.Metric("kvroute.router.request_body_us")
	skipOn, _ := onHost.Metric("kvroute.router.request_body_us")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		send(offURL, i)
		send(onURL, i)
	}
	b.StopTimer()
	off, on := median(offHost, len(skipOff.Samples)), median(onHost, len(skipOn.Samples))
	b.ReportMetric(off, "vm-body-us-off")
	b.ReportMetric(on, "vm-body-us-admission")
	if off > 0 {
		b.ReportMetric(on/off, "ratio")
	}
	if onHost.CounterValue(statnames.Tagged(statnames.Admission, statnames.TagBand, "standard", "held_total")) != 0 {
		b.Fatal("a request was held: the benchmark measures the admitted path")
	}
}
