package filter

// Wasm tests of what the router lets reach an engine, in both modes: the
// built dist/kvroute.wasm in internal/sim/wasmhost. Body mode runs with
// allow_on_headers_stop_iteration (the filter holds the headers while it
// reads the body), header-only mode without it, as Istio's WasmPlugin does:
// there Envoy forwards the headers before the body reaches the filter.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/internal/deploy/manifests"
	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/wasmhosttest"
)

// seenRequest is one request an engine received.
type seenRequest struct {
	engine, path string
	header       http.Header
	body         string
}

// recordingEngines are n upstreams that record every request they get and
// answer a completion.
type recordingEngines struct {
	mu    sync.Mutex
	seen  []seenRequest
	addrs []string
	by    map[string]int // requests per engine
}

func newRecordingEngines(t testing.TB, n int) *recordingEngines {
	e := &recordingEngines{by: map[string]int{}}
	for range n {
		var addr string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			e.mu.Lock()
			e.seen = append(e.seen, seenRequest{addr, r.URL.EscapedPath(), r.Header.Clone(), string(b)})
			e.by[addr]++
			e.mu.Unlock()
			w.Header().Set("content-type", "application/json")
			io.WriteString(w, `{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
		}))
		t.Cleanup(srv.Close)
		addr = srv.Listener.Addr().String()
		e.addrs = append(e.addrs, addr)
	}
	return e
}

func (e *recordingEngines) requests() []seenRequest {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]seenRequest(nil), e.seen...)
}

// modes are the router's two ways to run: body mode and header-only mode.
var modes = []struct {
	name string
	body bool
}{{"body", true}, {"header-only", false}}

// startMode runs the router in one mode (bodyRouting as given, and
// allow_on_headers_stop_iteration only in body mode) with cfg (a JSON
// object's members after the endpoints, each with its leading comma).
func startMode(t testing.TB, addrs []string, body bool, cfg string) (*wasmhost.Host, string) {
	t.Helper()
	return startConfig(t, addrs, body, "{"+endpointsJSON(addrs)+fmt.Sprintf(`,"bodyRouting":%v`, body)+cfg+"}")
}

// startConfig runs the router with the plugin configuration conf in front
// of the engines addrs, with allow_on_headers_stop_iteration as allow says.
func startConfig(t testing.TB, addrs []string, allow bool, conf string) (*wasmhost.Host, string) {
	t.Helper()
	return wasmhosttest.Start(t, wasmhost.Config{
		Module: testenv.Module(t), VMID: "kvroute",
		Filters:  []wasmhost.Filter{{RootID: RootRouter, AllowOnHeadersStopIteration: allow, Configuration: conf}},
		Clusters: map[string][]string{"engines": addrs}, RouteCluster: "engines",
	})
}

// The state path is answered by the filter in every mode, under every
// spelling an HTTP server reads as it, and never reaches an engine (with
// its bearer token or its body). Header-only mode cannot read a push's body
// before the headers would go upstream, so it refuses the push (501) from
// the headers.
func TestWasmStatePathNeverReachesAnEngine(t *testing.T) {
	spellings := []string{"/.kvroute/v1/state", "/.kvroute/v1/state/", "/.kvroute//v1/state", "/.KVROUTE/v1/state",
		"/.kvroute/v1/stat%65", "/.kvroute/v1/state?x=1"}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			eng := newRecordingEngines(t, 2)
			h, url := startMode(t, eng.addrs, m.body, `,"strategy":"round_robin","state":{"token":"`+stateToken+`"}`)
			good := map[string]string{"authorization": "Bearer " + stateToken}
			for _, path := range spellings {
				for _, tc := range []struct {
					name string
					hdr  map[string]string
					body string
					want int
				}{
					{"good push", good, pushBody(time.Now().UnixMilli(), eng.addrs...), 200},
					{"wrong token", map[string]string{"authorization": "Bearer wrong"}, pushBody(time.Now().UnixMilli(), eng.addrs...), 401},
					{"bad body", good, `{"version":1,`, 400},
				} {
					want := tc.want
					if !m.body && want != 401 {
						want = 501 // header-only: refused from the headers
					}
					code, body, _ := testenv.Call(t, "POST", url+path, tc.body, tc.hdr)
					if code != want {
						t.Errorf("%s %s: %d %s, want %d", tc.name, path, code, body, want)
					}
				}
			}
			if got := eng.requests(); len(got) != 0 {
				t.Errorf("engines received %d requests to the state path, e.g. %s with authorization %q", len(got), got[0].path, got[0].header.Get("authorization"))
			}
			if !m.body {
				if _, _, ok := h.SharedData(stateGenKey); ok {
					t.Error("header-only mode stored a push it could not read")
				}
			}
		})
	}
}

// shippedPluginConfig returns the plugin configuration of the first
// WasmPlugin in the shipped file, as JSON, with its endpoints replaced by
// addrs.
func shippedPluginConfig(t *testing.T, file string, addrs []string) (string, map[string]any) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	docs, err := manifests.SplitDocuments(file, data)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		var obj struct {
			Kind string `json:"kind"`
			Spec struct {
				PluginConfig map[string]any `json:"pluginConfig"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(d, &obj); err != nil {
			t.Fatal(err)
		}
		if obj.Kind != "WasmPlugin" {
			continue
		}
		pc := obj.Spec.PluginConfig
		var eps []map[string]string
		for _, a := range addrs {
			eps = append(eps, map[string]string{"address": a})
		}
		pc["endpoints"] = eps
		b, err := json.Marshal(pc)
		if err != nil {
			t.Fatal(err)
		}
		return string(b), pc
	}
	t.Fatalf("%s: no WasmPlugin", file)
	return "", nil
}

// The shipped Istio WasmPlugin (header-only) promises prefix affinity on
// its prefixKeyHeader: requests with the same key land on one engine, and
// the key, an x-kvroute-* header, never reaches it. Its own values, read
// from the file, run unedited but for the engine addresses, with
// allow_on_headers_stop_iteration off as WasmPlugin leaves it.
func TestWasmShippedWasmPluginPrefixKeyAffinity(t *testing.T) {
	eng := newRecordingEngines(t, 4)
	conf, pc := shippedPluginConfig(t, "../envoy/istio/wasmplugin-header-only.yaml", eng.addrs)
	keyHeader, _ := pc["prefixKeyHeader"].(string)
	if keyHeader == "" || pc["bodyRouting"] != false {
		t.Fatalf("the shipped WasmPlugin no longer runs header-only with a prefix key header: %s", conf)
	}
	_, url := startConfig(t, eng.addrs, false, conf)
	// Twelve keys: six all land on one of the three engines about once in
	// 250 runs (the engines' ports, and so the hash's picks, change per
	// run), twelve about once in 170,000.
	const keys, per = 12, 4
	for i := range keys * per {
		key := fmt.Sprintf("tenant-%d-system-prompt-sha256-%064d", i%keys, i%keys)
		if code, body, _ := testenv.Call(t, "POST", url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
			map[string]string{keyHeader: key}); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, body)
		}
	}
	got := eng.requests()
	if len(got) != keys*per {
		t.Fatalf("engines got %d requests, want %d", len(got), keys*per)
	}
	// The requests went one at a time, key i%keys: which engines served
	// each key.
	byKey := map[int]map[string]bool{}
	for i, r := range got {
		if v := r.header.Get(keyHeader); v != "" {
			t.Fatalf("the engine received %s: %q", keyHeader, v)
		}
		if byKey[i%keys] == nil {
			byKey[i%keys] = map[string]bool{}
		}
		byKey[i%keys][r.engine] = true
	}
	used := map[string]bool{}
	for k, engines := range byKey {
		if len(engines) != 1 {
			t.Errorf("key %d went to %d engines %v, want 1 (prefix affinity)", k, len(engines), engines)
		}
		for e := range engines {
			used[e] = true
		}
	}
	if len(used) < 2 {
		t.Errorf("%d keys all went to %v: no spread", keys, used)
	}
}

// P/D fields in a client's body never reach an engine: on every path an
// engine serves, under every spelling of an inference path, in both modes.
func TestWasmClientPDFieldsStrippedOnEveryPathAndMode(t *testing.T) {
	paths := []string{"/v1/chat/completions", "/v1/completions", "/v1/chat/completion%73", "/v1/chat/completions/",
		"/V1/chat/completions", "/v1//chat/completions", "/invocations", "/v1/responses", "/generate"}
	pd := `"kv_transfer_params":{"remote_host":"169.254.169.254","remote_port":1},"bootstrap_host":"169.254.169.254","bootstrap_port":8998,"bootstrap_room":7`
	bodies := []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],` + pd + `}`,
		`{` + pd + `,"model":"m","prompt":"hi"}`,
		`  {"model":"m","input":"hi","kv_transfer_param\u0073":{"remote_host":"169.254.169.254"}}`,
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			eng := newRecordingEngines(t, 1)
			h, url := startMode(t, eng.addrs, m.body, `,"fallbacks":0`)
			sent := 0
			for _, path := range paths {
				for _, body := range bodies {
					code, reply, _ := testenv.Call(t, "POST", url+path, body, nil)
					if code != 200 && code != 400 {
						t.Errorf("%s: %d %s", path, code, reply)
					}
					sent++
				}
			}
			got := eng.requests()
			if len(got) == 0 {
				t.Fatal("no request reached the engine")
			}
			for _, r := range got {
				if strings.Contains(r.body, "169.254") || strings.Contains(r.body, "bootstrap") || strings.Contains(r.body, "transfer") {
					t.Errorf("%s: the engine received %q", r.path, r.body)
				}
				if !gjson.Valid(r.body) || gjson.Get(r.body, "model").Str != "m" {
					t.Errorf("%s: the engine received a broken body %q", r.path, r.body)
				}
			}
			if h.CounterValue("kvroute.router.client_pd_fields_removed") == 0 {
				t.Error("client_pd_fields_removed not counted")
			}
			// Bodies that are not JSON objects go through untouched; a
			// body with a byte-order mark or in UTF-16 (which Python's json
			// reads) is refused; a broken one that may spell a field too,
			// when what is broken is in what kvroute reads (a P/D member's
			// value is not read: the member goes, whatever it holds).
			for _, tc := range []struct {
				body string
				want int
			}{
				{"--boundary\r\ncontent-disposition: form-data; name=\"file\"\r\n\r\nbytes\r\n--boundary--\r\n", 200},
				{"\xef\xbb\xbf{\"model\":\"m\",\"kv_transfer_params\":{}}", 400},
				{"\x00{\x00\"\x00k\x00v\x00", 400},
				{`{"model":NaN,"kv_transfer_params":{"x":1}}`, 400},
				{`{"model":"m","kv_transfer_params":{"x":NaN}}`, 200},
				{`{"model":"m","temperature":NaN}`, 200},
			} {
				if code, reply, _ := testenv.Call(t, "POST", url+"/invocations", tc.body, nil); code != tc.want {
					t.Errorf("/invocations %q: %d %s, want %d", tc.body, code, reply, tc.want)
				}
			}
			for _, r := range eng.requests() {
				if strings.Contains(r.body, "kv_transfer") || strings.Contains(r.body, "\x00") || strings.HasPrefix(r.body, "\xef\xbb\xbf") {
					t.Errorf("%s: the engine received %q", r.path, r.body)
				}
			}
		})
	}
}

// A request for a model no endpoint serves is answered 404 as an OpenAI
// server answers it, and counted; one the endpoints serve is routed.
func TestWasmUnservedModelIs404(t *testing.T) {
	eng := newRecordingEngines(t, 2)
	h, url := startConfig(t, eng.addrs, true, fmt.Sprintf(`{"endpoints":[{"address":%q,"model":"llama-3-8b"},{"address":%q,"model":"qwen"}],"strategy":"round_robin"}`, eng.addrs[0], eng.addrs[1]))
	code, body, _ := testenv.Call(t, "POST", url+"/v1/chat/completions", `{"model":"gpt-x","messages":[{"role":"user","content":"hi"}]}`, nil)
	want := `{"error":{"message":"The model 'gpt-x' does not exist.","type":"invalid_request_error","param":"model","code":"model_not_found"}}`
	if code != 404 || body != want {
		t.Errorf("unserved model: %d %s, want 404 %s", code, body, want)
	}
	for _, model := range []string{"llama-3-8b", "qwen"} {
		if code, body, _ := testenv.Call(t, "POST", url+"/v1/chat/completions", `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`, nil); code != 200 {
			t.Errorf("%s: %d %s", model, code, body)
		}
	}
	if n := len(eng.requests()); n != 2 {
		t.Errorf("engines got %d requests, want 2 (the unserved model reached one?)", n)
	}
	if got := h.CounterValue("kvroute.router.requests.model_not_found"); got != 1 {
		t.Errorf("requests.model_not_found = %d, want 1", got)
	}
}

// A client's own priority header is stripped unread: only the header the
// operator's Envoy sets (admission.priorityHeader) ranks a request.
func TestWasmClientPriorityIsIgnored(t *testing.T) {
	for _, tc := range []struct {
		name, admission, header string
		want                    int // status of a malformed value
	}{
		{"default", "", PriorityHeader, 200},
		{"operator header", `,"priorityHeader":"x-gateway-class"`, "x-gateway-class", 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := newRecordingEngines(t, 1)
			_, url := startMode(t, eng.addrs, true, `,"fallbacks":0,"admission":{"maxWaiting":0,"maxKvUsage":0,"maxPendingPrefillTokens":1`+tc.admission+`}`)
			code, body, _ := testenv.Call(t, "POST", url+"/v1/completions", `{"model":"m","prompt":"hi"}`, map[string]string{tc.header: "urgent"})
			if code != tc.want {
				t.Errorf("%s: urgent: %d %s, want %d", tc.header, code, body, tc.want)
			}
			for _, r := range eng.requests() {
				if r.header.Get(PriorityHeader) != "" {
					t.Errorf("the engine received %s", PriorityHeader)
				}
			}
		})
	}
}

// A request that fails open after a recovered panic still loses the
// client's P/D fields: a panic in the headers (both modes) or in the body
// after the parse (body mode) must not forward them.
func TestWasmFailOpenStillStripsClientPDFields(t *testing.T) {
	body := `{"model":"m","prompt":"hello","kv_transfer_params":{"remote_host":"169.254.169.254"},"bootstrap_host":"169.254.169.254"}`
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			eng := newRecordingEngines(t, 2)
			h, url := startMode(t, eng.addrs, m.body, `,"testHooks":true`)
			hooks := []string{"recover"}
			if m.body {
				hooks = append(hooks, "recover-body")
			}
			for _, hook := range hooks {
				if code, reply, _ := testenv.Call(t, "POST", url+"/v1/completions", body, map[string]string{"x-kvroute-test-panic": hook}); code != 200 {
					t.Errorf("%s: %d %s", hook, code, reply)
				}
			}
			got := eng.requests()
			if len(got) != len(hooks) {
				t.Fatalf("engines got %d requests, want %d", len(got), len(hooks))
			}
			for _, r := range got {
				if strings.Contains(r.body, "169.254") || gjson.Get(r.body, "prompt").Str != "hello" {
					t.Errorf("after a recovered panic the engine received %q", r.body)
				}
			}
			if n := h.CounterValue("kvroute.router.recovered_panics"); n != int64(len(hooks)) {
				t.Errorf("recovered_panics = %d, want %d", n, len(hooks))
			}
			if h.VMFailures() != 0 {
				t.Error("a recovered panic failed the VM")
			}
		})
	}
}

// Header-only mode takes its candidates by pulling the metrics service's
// snapshot (state.pull), since it cannot take pushes: the pull carries the
// state token, its hosts become the candidates on every worker, and a
// snapshot no newer than the one in force is not stored again.
func TestWasmHeaderOnlyPullsState(t *testing.T) {
	eng := newRecordingEngines(t, 3)
	var mu sync.Mutex
	var auths []string
	snapshot := pushBody(time.Now().UnixMilli(), eng.addrs[1], eng.addrs[2])
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auths = append(auths, r.Method+" "+r.URL.Path+" "+r.Header.Get("authorization"))
		mu.Unlock()
		io.WriteString(w, snapshot)
	}))
	t.Cleanup(metrics.Close) // after the host's, which Start registers next
	// The pull interval is kept in the proxy's time: this clock's.
	clock := testenv.NewClock(time.Now())
	h, url := wasmhosttest.Start(t, wasmhost.Config{
		Module: testenv.Module(t), VMID: "kvroute", Workers: 2, Dispatch: wasmhost.DispatchStream,
		Filters: []wasmhost.Filter{{RootID: RootRouter, Configuration: `{` + endpointsJSON(eng.addrs[:1]) +
			`,"bodyRouting":false,"strategy":"round_robin","fallbacks":0,"state":{"token":"` + stateToken + `","pull":{"cluster":"kvroute_metrics","intervalMs":100}}}`}},
		Clusters:     map[string][]string{"engines": eng.addrs, "kvroute_metrics": {metrics.Listener.Addr().String()}},
		RouteCluster: "engines",
		Clock:        clock.Now,
	})
	h.FireTicks()
	// Both workers' answers taken (the callback returned), so the count of
	// stored snapshots is final for this round.
	testenv.WaitFor(t, "both workers' pulls answered", func() bool {
		return callCount(h, "proxy_on_http_call_response") >= 2
	})
	stored := h.CounterValue("kvroute.router.state.pulls") // 1, or 2 when both workers' answers raced
	clock.Advance(110 * time.Millisecond)                  // the pull interval
	h.FireTicks()                                          // the same snapshot again: nothing newer to store
	testenv.WaitFor(t, "the second round of pulls answered", func() bool {
		return callCount(h, "proxy_on_http_call_response") >= 4
	})
	for i := 0; i < 8; i++ {
		if code, body, _ := testenv.Call(t, "POST", url+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, body)
		}
	}
	eng.mu.Lock()
	by := eng.by
	eng.mu.Unlock()
	if by[eng.addrs[0]] != 0 || by[eng.addrs[1]] != 4 || by[eng.addrs[2]] != 4 {
		t.Errorf("requests per engine %v: want the pulled hosts only, 4 each", by)
	}
	if got := h.CounterValue("kvroute.router.state.pulls"); got != stored || got > 2 {
		t.Errorf("state.pulls = %d after pulling the same snapshot again, want %d", got, stored)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, a := range auths {
		if a != "GET /state Bearer "+stateToken {
			t.Errorf("a pull asked %q", a)
		}
	}
}

// callCount is how many times the host has run the callback name to its end.
func callCount(h *wasmhost.Host, name string) int64 {
	for _, c := range h.CallStats() {
		if c.Name == name && c.Kind == "callback" {
			return c.Count
		}
	}
	return 0
}
