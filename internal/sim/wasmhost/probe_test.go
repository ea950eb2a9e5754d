package wasmhost

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
)

// Envoy semantics, observed through testdata/probe (a raw-ABI module).

func probeHost(t *testing.T, f Filter, mutate func(*Config)) (*Host, string, *upstream) {
	t.Helper()
	up := newUpstream(t, nil)
	if f.RootID == "" {
		f.RootID = "probe"
	}
	cfg := Config{Module: probeModule(t), VMID: "probe", Filters: []Filter{f},
		Clusters: map[string][]string{"engines": {up.addr}}, RouteCluster: "engines"}
	if mutate != nil {
		mutate(&cfg)
	}
	h, url := startHost(t, cfg)
	return h, url, up
}

const body1k = `{"model":"m","prompt":"` // completed by jsonBody

func jsonBody(n int) string {
	s := body1k + strings.Repeat("a", n)
	return s[:n-2] + `"}`
}

// Envoy's default mode: a Pause in request headers becomes
// StopAllIterationAndWatermark, so a filter waiting for the body never gets
// it and the request goes nowhere (here until the stream idle timeout).
func TestPauseInRequestHeadersWithoutAllowNeverDeliversBody(t *testing.T) {
	h, url, up := probeHost(t, Filter{Configuration: "pause-headers"}, func(c *Config) {
		c.StreamIdleTimeout = 400 * time.Millisecond
	})
	r := do(t, "POST", url+"/v1/completions", jsonBody(1024), nil)
	if r.code != http.StatusRequestTimeout {
		t.Errorf("status %d %q, want 408 stream timeout (the request must stall)", r.code, r.body)
	}
	if got := h.CounterValue("probe.request_body"); got != 0 {
		t.Errorf("on_request_body ran %d times without allow_on_headers_stop_iteration, want 0", got)
	}
	if got := up.requests.Load(); got != 0 {
		t.Errorf("upstream got %d requests, want 0", got)
	}
	if got := h.CounterValue("probe.request_headers"); got != 1 {
		t.Errorf("on_request_headers ran %d times, want 1", got)
	}
}

// With allow_on_headers_stop_iteration the body reaches the filter while
// the headers wait, and header changes made before resuming go upstream.
func TestPauseInRequestHeadersWithAllowDeliversBody(t *testing.T) {
	for _, size := range []int{1024, 200 << 10} { // one read and several
		h, url, up := probeHost(t, Filter{Configuration: "pause-headers", AllowOnHeadersStopIteration: true}, nil)
		body := jsonBody(size)
		r := do(t, "POST", url+"/v1/completions", body, nil)
		if r.code != 200 {
			t.Fatalf("size %d: status %d %q", size, r.code, r.body)
		}
		if got := up.lastHeader("x-probe-body-len"); got != strconv.Itoa(size) {
			t.Errorf("size %d: upstream saw x-probe-body-len %q, want %d", size, got, size)
		}
		if got := up.lastHeader("x-probe-body-write"); got != "0" {
			t.Errorf("size %d: writing a request header in on_request_body returned %q, want 0 (Ok)", size, got)
		}
		up.mu.Lock()
		gotBody := string(up.lastBody)
		up.mu.Unlock()
		if gotBody != body {
			t.Errorf("size %d: upstream body differs (%d bytes)", size, len(gotBody))
		}
		if h.CounterValue("probe.request_body") < 1 {
			t.Errorf("on_request_body never ran")
		}
	}
}

func TestHeaderMapsDroppedAfterContinue(t *testing.T) {
	_, url, up := probeHost(t, Filter{}, nil)
	r := do(t, "POST", url+"/v1/completions", `{"prompt":"x"}`, nil)
	if r.code != 200 {
		t.Fatalf("%d %s", r.code, r.body)
	}
	want := map[string]string{
		"X-Probe-Late-Write":               "2", // BadArgument: the request map is gone
		"X-Probe-Late-Read":                "2",
		"X-Probe-Late-Pairs":               "0", // pairs come back empty
		"X-Probe-Path-Property":            "1", // NotFound without the map
		"X-Probe-Config-Outside-Configure": "1", // plugin config: NotFound
		"X-Probe-Root-Id":                  "probe",
		"X-Probe-Upstream":                 up.addr + "/0",
	}
	for k, v := range want {
		if got := r.header.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if up.lastHeader("x-probe-late") != "" {
		t.Errorf("a write after the headers continued reached the upstream")
	}
}

// By default a connection's streams stay on one worker, as in Envoy, and
// connections spread over the workers.
func TestDispatchConnectionPinsAConnectionToOneWorker(t *testing.T) {
	h, url, _ := probeHost(t, Filter{}, func(c *Config) { c.Workers = 2 })
	get := func(c *http.Client) {
		t.Helper()
		resp, err := c.Get(url + "/x")
		if code := testenv.Drain(t, resp, err); code != 200 {
			t.Fatalf("status %d", code)
		}
	}
	served := func() []int64 {
		var n []int64
		for _, w := range h.Workers() {
			n = append(n, w.Requests)
		}
		return n
	}
	one := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	defer one.CloseIdleConnections()
	const n = 12
	for range n {
		get(one)
	}
	if got := served(); !(got[0] == n && got[1] == 0 || got[0] == 0 && got[1] == n) {
		t.Fatalf("one connection's %d streams went to workers as %v, want all on one", n, got)
	}
	// 32 connections, one stream each: all on one worker has odds of 2^-31.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for range 32 {
		get(fresh)
	}
	if got := served(); got[0] == 0 || got[1] == 0 || got[0]+got[1] != n+32 {
		t.Errorf("streams per worker after 32 new connections: %v, want both workers used", got)
	}
}

func TestStreamEndCallbacksAndSharedDataAcrossWorkers(t *testing.T) {
	h, url, _ := probeHost(t, Filter{}, func(c *Config) { c.Workers, c.Dispatch = 2, DispatchStream })
	const n = 20
	for i := 0; i < n; i++ {
		if r := do(t, "GET", url+"/x", "", nil); r.code != 200 {
			t.Fatalf("%d %s", r.code, r.body)
		}
	}
	// The client may have its response before the stream's end callbacks ran.
	testenv.WaitFor(t, "on_done of every stream", func() bool { return h.CounterValue("probe.delete") == n })
	for _, m := range []string{"probe.log", "probe.done", "probe.delete", "probe.log_path_readable"} {
		if got := h.CounterValue(m); got != n {
			t.Errorf("%s = %d, want %d", m, got, n)
		}
	}
	for _, w := range h.Workers() {
		if w.Requests != n/2 {
			t.Errorf("worker %d served %d streams, want %d (round robin)", w.Index, w.Requests, n/2)
		}
	}
	calls := map[string]CallStat{}
	for _, c := range h.CallStats() {
		calls[c.Name] = c
	}
	if c := calls["proxy_on_request_headers"]; c.Kind != "callback" || c.Count != n || c.Total <= 0 {
		t.Errorf("CallStats proxy_on_request_headers = %+v, want %d callback calls", c, n)
	}
	if c := calls["proxy_set_shared_data"]; c.Kind != "host" || c.Count < n {
		t.Errorf("CallStats proxy_set_shared_data = %+v, want >= %d host calls", c, n)
	}
	// Both VMs incremented one shared key with CAS: one map per vm_id.
	v, cas, ok := h.SharedData("probe.count")
	if !ok || string(v) != strconv.Itoa(n) || cas == 0 {
		t.Errorf("shared probe.count = %q (cas %d, found %v), want %d", v, cas, ok, n)
	}
}

func TestLocalResponseEndsStream(t *testing.T) {
	h, url, up := probeHost(t, Filter{}, nil)
	r := do(t, "POST", url+"/v1/completions", `{"prompt":"x"}`, map[string]string{"x-probe-local": "418"})
	if r.code != 418 || r.body != "local reply" {
		t.Errorf("got %d %q, want 418 \"local reply\"", r.code, r.body)
	}
	if up.requests.Load() != 0 {
		t.Errorf("a local reply still reached the upstream")
	}
	// The local reply runs through the encoder side of the filter.
	if h.CounterValue("probe.response_headers") != 1 || h.CounterValue("probe.request_body") != 0 {
		t.Errorf("response_headers %d, request_body %d; want 1, 0",
			h.CounterValue("probe.response_headers"), h.CounterValue("probe.request_body"))
	}
}

func TestTrapFailsWorkerPerFailStrategy(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		h, url, up := probeHost(t, Filter{}, func(c *Config) { c.Workers = 1; c.FailOpen = failOpen })
		r := do(t, "GET", url+"/x", "", map[string]string{"x-probe-trap": "1"})
		r2 := do(t, "GET", url+"/x", "", nil)
		want := 503
		if failOpen {
			want = 200
		}
		if r.code != want || r2.code != want {
			t.Errorf("fail_open=%v: trap %d, next %d, want %d", failOpen, r.code, r2.code, want)
		}
		if !h.Workers()[0].Failed || len(h.LogsContaining("failed: Function: proxy_on_request_headers")) != 1 {
			t.Errorf("fail_open=%v: worker not marked failed: %v", failOpen, h.Logs())
		}
		if failOpen && up.requests.Load() != 2 || !failOpen && up.requests.Load() != 0 {
			t.Errorf("fail_open=%v: upstream got %d", failOpen, up.requests.Load())
		}
		if h.CounterValue("probe.done") != 0 {
			t.Errorf("on_done ran on a failed VM")
		}
	}
}

func TestDispatchHTTPCallAndEffectiveContext(t *testing.T) {
	side := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "side says hi")
	})
	_, url, up := probeHost(t, Filter{AllowOnHeadersStopIteration: true}, func(c *Config) {
		c.Clusters["side"] = []string{side.addr}
	})
	r := do(t, "GET", url+"/x", "", map[string]string{"x-probe-callout": "side"})
	if r.code != 200 {
		t.Fatalf("%d %s", r.code, r.body)
	}
	if got := up.lastHeader("x-probe-callout-status"); got != "200" {
		t.Errorf("callout status seen upstream %q, want 200", got)
	}
	if got := up.lastHeader("x-probe-callout-body"); got != "side says hi" {
		t.Errorf("callout body %q", got)
	}
	r = do(t, "GET", url+"/x", "", map[string]string{"x-probe-callout": "nope"})
	if got := up.lastHeader("x-probe-callout-status"); r.code != 200 || got != "dispatch-2" {
		t.Errorf("unknown cluster: %d, dispatch status %q, want BadArgument (2)", r.code, got)
	}
}

func TestTicksPerRootContext(t *testing.T) {
	h, _, _ := probeHost(t, Filter{Configuration: "tick"}, nil)
	testenv.WaitFor(t, "on_tick", func() bool { return h.CounterValue("probe.ticks") >= 4 })
	before := h.CounterValue("probe.ticks")
	h.FireTicks() // one per VM
	if got := h.CounterValue("probe.ticks"); got < before+2 {
		t.Errorf("FireTicks: %d -> %d, want +2 (two VMs)", before, got)
	}
}

// Config.Clock is the module's wall clock, read either way
// (proxy_get_current_time_nanoseconds and WASI's realtime clock, Go's
// time.Now): moving it moves both at once, by exactly as much, while the
// monotonic clock (time.Since) goes on measuring real time.
func TestClockIsTheModulesWallClock(t *testing.T) {
	var nanos atomic.Int64
	nanos.Store(time.Date(2030, 1, 2, 3, 4, 5, 6000, time.UTC).UnixNano())
	_, url, up := probeHost(t, Filter{}, func(c *Config) {
		c.Clock = func() time.Time { return time.Unix(0, nanos.Load()) }
	})
	read := func() (proxy, wasi, mono int64) {
		t.Helper()
		if r := do(t, "GET", url+"/v1/models", "", map[string]string{"x-probe-clock": "1"}); r.code != 200 {
			t.Fatalf("status %d %q", r.code, r.body)
		}
		for _, f := range []struct {
			h string
			v *int64
		}{{"x-probe-proxy-now", &proxy}, {"x-probe-wasi-now", &wasi}, {"x-probe-since-start", &mono}} {
			n, err := strconv.ParseInt(up.lastHeader(f.h), 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", f.h, err)
			}
			*f.v = n
		}
		return proxy, wasi, mono
	}
	p1, w1, m1 := read()
	if want := nanos.Load(); p1 != want || w1 != want {
		t.Fatalf("proxy_get_current_time %d, time.Now %d; want both the clock's %d", p1, w1, want)
	}
	nanos.Add(int64(90 * time.Minute))
	time.Sleep(10 * time.Millisecond)
	p2, w2, m2 := read()
	if p2-p1 != int64(90*time.Minute) || w2-w1 != int64(90*time.Minute) {
		t.Errorf("after moving the clock 90 minutes: proxy_get_current_time moved %v, time.Now %v; want 90m0s both",
			time.Duration(p2-p1), time.Duration(w2-w1))
	}
	if d := time.Duration(m2 - m1); d < 10*time.Millisecond || d >= 90*time.Minute {
		t.Errorf("time.Since moved %v across a 10 ms wait while the wall clock moved 90 minutes; want the real time passed (the monotonic clock is not Config.Clock)", d)
	}
}

func TestSSEStreamsChunkByChunk(t *testing.T) {
	// The upstream writes each event once the client has read the one
	// before (next), so no two events can reach the host in one read,
	// however slowly it reads.
	next := make(chan struct{})
	sse := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for _, ev := range []string{"one", "two", "three"} {
			if ev != "one" {
				select {
				case <-next:
				case <-r.Context().Done():
					return
				}
			}
			fmt.Fprintf(w, "data: %s\n\n", ev)
			fl.Flush()
		}
	})
	h, url := startHost(t, Config{Module: probeModule(t), VMID: "probe", Filters: []Filter{{RootID: "probe"}},
		Clusters: map[string][]string{"engines": {sse.addr}}, RouteCluster: "engines"})
	resp, err := http.Get(url + "/v1/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for _, want := range []string{"data: one\n", "data: two\n", "data: three\n"} {
		line, err := br.ReadString('\n')
		if err != nil || line != want {
			t.Fatalf("event %q, %v; want %q: each event reaches the client before the upstream writes the next", line, err, want)
		}
		if line, err := br.ReadString('\n'); err != nil || line != "\n" {
			t.Fatalf("after %q: %q, %v; want the event's blank line", want, line, err)
		}
		if want != "data: three\n" {
			next <- struct{}{}
		}
	}
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Errorf("after the last event: %q, %v; want the stream's end", rest, err)
	}
	m, _ := h.Metric("probe.response_chunk")
	nonEmpty := 0
	for _, s := range m.Samples {
		if s > 0 {
			nonEmpty++
		}
	}
	if nonEmpty != 3 {
		t.Errorf("on_response_body saw %d non-empty chunks %v, want 3 (one per event)", nonEmpty, m.Samples)
	}
}

func TestClientDisconnectEndsStreamForFilter(t *testing.T) {
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	slow := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	})
	h, url := startHost(t, Config{Module: probeModule(t), VMID: "probe", Filters: []Filter{{RootID: "probe"}},
		Clusters: map[string][]string{"engines": {slow.addr}}, RouteCluster: "engines"})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/x", nil)
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("request completed; the upstream should hang")
	}
	testenv.WaitFor(t, "on_done after client disconnect", func() bool {
		return h.CounterValue("probe.done") == 1 && h.CounterValue("probe.delete") == 1 && h.CounterValue("probe.log") == 1
	})
}

func TestProbeConfigureFailureNamesField(t *testing.T) {
	_, err := New(context.Background(), Config{Module: probeModule(t), VMID: "probe",
		Filters: []Filter{{RootID: "probe", Configuration: "fail-configure"}}})
	var pse *PluginStartError
	if !errors.As(err, &pse) || !strings.Contains(err.Error(), `field "mode"`) {
		t.Fatalf("err = %v, want a PluginStartError quoting the module's log naming field \"mode\"", err)
	}
}

func TestBufferLimitAnswers413(t *testing.T) {
	_, url, up := probeHost(t, Filter{Configuration: "pause-headers", AllowOnHeadersStopIteration: true}, func(c *Config) {
		c.BufferLimitBytes = 64 << 10
	})
	r := do(t, "POST", url+"/v1/completions", jsonBody(300<<10), nil)
	if r.code != http.StatusRequestEntityTooLarge {
		t.Errorf("status %d, want 413", r.code)
	}
	if up.requests.Load() != 0 {
		t.Errorf("upstream got the oversized request")
	}
}

// dispatch_http_call honours the override_host policy on the call's own
// destination header (Envoy's async client runs the router): the listed
// address is used, a dead one is skipped on connect failure.
func TestDispatchHTTPCallFollowsOverrideHost(t *testing.T) {
	a := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "a") })
	b := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "b") })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	h, err := New(context.Background(), Config{Module: probeModule(t), VMID: "probe",
		Filters:  []Filter{{RootID: "probe"}},
		Clusters: map[string][]string{"side": {a.addr, b.addr, dead}}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	cl := h.clusters["side"]
	for _, tc := range []struct{ dest, want string }{{b.addr, "b"}, {"10.9.9.9:1," + a.addr, "a"}, {dead + "," + b.addr, "b"}} {
		hm := &headerMap{}
		hm.set([]Pair{{":method", "GET"}, {":path", "/"}, {":authority", "side"}, {DefaultDestinationHeader, tc.dest}})
		r := h.callOut(context.Background(), cl, hm, nil)
		if r == nil || string(r.body) != tc.want {
			t.Errorf("destination %q: got %+v, want body %q", tc.dest, r, tc.want)
		}
	}
}

// Host calls answer with the statuses Envoy gives (0 Ok, 1 NotFound,
// 2 BadArgument, 4 ParseFailure, 7 Empty, 8 CasMismatch, 12 Unimplemented).
func TestABIStatusesMatchEnvoy(t *testing.T) {
	_, url, up := probeHost(t, Filter{Name: "probe-plugin"}, nil)
	if r := do(t, "GET", url+"/x?q", "", map[string]string{"x-probe-abi": "1"}); r.code != 200 {
		t.Fatalf("%d %s", r.code, r.body)
	}
	got := map[string]string{}
	for _, kv := range strings.Split(up.lastHeader("x-probe-abi-result"), ",") {
		k, v, _ := strings.Cut(kv, "=")
		got[k] = v
	}
	want := map[string]string{
		"get_header_missing": "1", "get_header_bad_type": "2", "get_call_response_header_outside": "2",
		"add_response_trailer": "2", "header_map_size_request": "0",
		"counter_increment_zero": "2", "counter_increment_negative": "2", "gauge_increment_negative": "0",
		"get_metric_histogram": "2", "get_metric_unknown": "1", "define_metric_bad_type": "2",
		"get_shared_missing": "1", "set_shared_stale_cas": "8", "set_shared_cas_zero": "0",
		"resolve_queue_unknown": "1", "dequeue_unknown": "1", "dequeue_empty": "7",
		"log_bad_level": "2", "effective_context_unknown": "2",
		"get_buffer_bad_type": "2", "get_call_response_body_outside": "1", "get_plugin_config_outside": "1",
		"set_vm_config": "2", "set_request_body_headers_phase": "2",
		"foreign_function_unknown": "1", "done_outside_shutdown": "1", "grpc_call": "4",
		"continue_stream_bad": "2", "continue_stream_upstream": "12",
		"property_unknown": "1", "property_vm_id_probe": "0", "property_request_path": "0",
		// Values, not only statuses: request.path is the :path header, query
		// included, as in Envoy; plugin_name is the configured name, which
		// differs from the root id.
		"property_request_path_value_/x?q": "0", "property_plugin_name_probe-plugin": "0",
		"property_plugin_root_id_probe": "0",
		"http_call_no_authority":        "2",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: status %q, want %s", k, got[k], v)
		}
	}
}

func TestSharedQueueReadyOnRegisteringVM(t *testing.T) {
	h, _, _ := probeHost(t, Filter{Configuration: "queue"}, nil)
	if err := h.Enqueue("probe.q", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "on_queue_ready", func() bool {
		v, _, ok := h.SharedData("probe.q.last")
		return ok && string(v) == "hello"
	})
	if got := h.CounterValue("probe.queue_ready"); got != 1 {
		t.Errorf("on_queue_ready ran %d times, want 1 (only the last VM to register gets it)", got)
	}
	if err := h.Enqueue("nope", nil); err == nil {
		t.Error("Enqueue to an unregistered queue succeeded")
	}
}

// A Pause in response headers follows the same two modes: with the setting
// the filter reads the whole response body and can rewrite headers and
// body before they go out; without it the body is held from the filter.
func TestPauseInResponseHeaders(t *testing.T) {
	want := `{"id":"cmpl-1","choices":[{"text":"ok"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`
	_, url, _ := probeHost(t, Filter{Configuration: "pause-response", AllowOnHeadersStopIteration: true}, nil)
	r := do(t, "GET", url+"/x", "", nil)
	if r.code != 200 || r.header.Get("x-probe-resp-body-len") != strconv.Itoa(len(want)) || r.body != "["+want+"]" {
		t.Errorf("allow: %d %q len header %q", r.code, r.body, r.header.Get("x-probe-resp-body-len"))
	}
	h, url, _ := probeHost(t, Filter{Configuration: "pause-response"}, func(c *Config) {
		c.StreamIdleTimeout = 300 * time.Millisecond
	})
	r = do(t, "GET", url+"/x", "", nil)
	if r.code != http.StatusRequestTimeout || h.CounterValue("probe.response_body") != 0 {
		t.Errorf("no allow: %d %q, on_response_body ran %d times; want 408 and 0",
			r.code, r.body, h.CounterValue("probe.response_body"))
	}
}

// A Pause in request headers (StopAllIterationAndWatermark) holds a body
// over the buffer limit with flow control, not a 413: the stream waits.
func TestWatermarkPauseOverLimitWaitsInsteadOf413(t *testing.T) {
	h, url, up := probeHost(t, Filter{Configuration: "pause-headers"}, func(c *Config) {
		c.BufferLimitBytes = 64 << 10
		c.StreamIdleTimeout = 400 * time.Millisecond
	})
	r := do(t, "POST", url+"/v1/completions", jsonBody(300<<10), nil)
	if r.code != http.StatusRequestTimeout || up.requests.Load() != 0 || h.CounterValue("probe.request_body") != 0 {
		t.Errorf("status %d, upstream %d, on_request_body %d; want 408, 0, 0",
			r.code, up.requests.Load(), h.CounterValue("probe.request_body"))
	}
}

// A local reply before the request body was read closes the connection, so
// unread body bytes never parse as the next request on a keep-alive client.
func TestLocalReplyBeforeBodyClosesConnection(t *testing.T) {
	_, url, _ := probeHost(t, Filter{}, nil)
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Announce 5000 bytes, send 100: the rest would be "the next request".
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nx-probe-local: 413\r\nContent-Length: 5000\r\n\r\n%s", strings.Repeat("a", 100))
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 || !resp.Close {
		t.Errorf("status %d, Connection: close %v; want the filter's 413 and a closed connection", resp.StatusCode, resp.Close)
	}
}

// A local reply while the client is still sending its body closes the
// connection as Envoy does, with a delayed close: the rest of the body is
// read and dropped, so the client's writes succeed and it reads the reply
// (closing at once resets the connection under the writer, whose HTTP
// client then may report the write error instead of the response). A
// client that never finishes loses the connection after the delay.
func TestLocalReplyDuringBodyLetsTheClientFinish(t *testing.T) {
	_, url, _ := probeHost(t, Filter{}, func(c *Config) { c.DelayedCloseTimeout = 30 * time.Second })
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nx-probe-local: 413\r\nTransfer-Encoding: chunked\r\n\r\n64\r\n%s\r\n", strings.Repeat("a", 100))
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 413 || !resp.Close {
		t.Fatalf("status %d, Connection: close %v; want the filter's 413 and a closed connection", resp.StatusCode, resp.Close)
	}
	// The rest of the body, in pieces, after the reply: each write lands.
	for i := 0; i < 3; i++ {
		time.Sleep(50 * time.Millisecond) // the reply is out: a closing host would have reset by now
		if _, err := fmt.Fprintf(conn, "64\r\n%s\r\n", strings.Repeat("b", 100)); err != nil {
			t.Fatalf("write %d of the body after the reply: %v", i, err)
		}
	}
	if _, err := io.WriteString(conn, "0\r\n\r\n"); err != nil {
		t.Fatalf("the body's end: %v", err)
	}
	if n, err := br.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Errorf("after the body: read %d bytes, %v; want the connection closed (EOF)", n, err)
	}

	// A client that stops sending loses the connection after the delay.
	_, url, _ = probeHost(t, Filter{}, func(c *Config) { c.DelayedCloseTimeout = 100 * time.Millisecond })
	conn2, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	fmt.Fprintf(conn2, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nx-probe-local: 413\r\nContent-Length: 5000\r\n\r\n%s", strings.Repeat("a", 100))
	conn2.SetDeadline(time.Now().Add(20 * time.Second))
	br = bufio.NewReader(conn2)
	if resp, err = http.ReadResponse(br, nil); err != nil || resp.StatusCode != 413 {
		t.Fatalf("stalled client: %v, %v; want the 413", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	if n, err := br.Read(make([]byte, 1)); n != 0 || err == nil || os.IsTimeout(err) {
		t.Errorf("stalled client: read %d bytes, %v; want the connection closed after the delay", n, err)
	}
}

// While _initialize runs (Go's init functions), proxy_* calls other than
// proxy_log trap, as in proxy-wasm-cpp-host; the environment comes from
// vm_config.environment_variables.
func TestHostCallDuringInitializeTraps(t *testing.T) {
	_, err := New(context.Background(), Config{Module: probeModule(t), VMID: "probe",
		Env: map[string]string{"PROBE_INIT_CALL": "1"}, Filters: []Filter{{RootID: "probe"}}})
	if err == nil || !strings.Contains(err.Error(), "restricted") || !strings.Contains(err.Error(), "proxy_set_tick_period_milliseconds") {
		t.Fatalf("err = %v, want a failed _initialize naming the restricted call", err)
	}
}

// TestBodiesEndWithAnEmptyChunk checks that a body reaches the filter as
// Envoy's HTTP/1 codec delivers it: the bytes with end_stream false, then
// the end as an empty chunk of its own, in both directions, even when the
// whole body came in one read. A filter that acts only on a chunk that
// carries both bytes and the end would never act in Envoy.
func TestBodiesEndWithAnEmptyChunk(t *testing.T) {
	h, url, _ := probeHost(t, Filter{}, nil)
	if r := do(t, "POST", url+"/v1/completions", jsonBody(1024), nil); r.code != 200 {
		t.Fatalf("status %d %q", r.code, r.body)
	}
	deadline := time.Now().Add(5 * time.Second)
	for h.CounterValue("probe.response_body") < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := h.CounterValue("probe.request_body"); got != 2 {
		t.Errorf("on_request_body ran %d times for a 1 KB body, want 2 (the bytes, then the end)", got)
	}
	m, _ := h.Metric("probe.response_chunk")
	if len(m.Samples) != 2 || m.Samples[0] == 0 || m.Samples[1] != 0 {
		t.Errorf("on_response_body chunk sizes %v, want [the body's length, 0]", m.Samples)
	}
}
