package filter

// The edge tests of edge_test.go in V8 (internal/testenv/v8host), for what depends
// on the host: a local reply from the request headers, a body buffered and
// rewritten after the headers went on (header-only mode, pass-through
// paths), a recovered panic's fail-open.

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/v8host"
)

func startV8(t *testing.T, addrs []string, conf string) *v8host.Host {
	t.Helper()
	needV8(t)
	h, err := v8host.Start(v8host.Config{Module: testenv.ModulePath(t), RootID: RootRouter, Upstreams: addrs, Configuration: conf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func v8Mode(t *testing.T, addrs []string, body bool, cfg string) *v8host.Host {
	return startV8(t, addrs, "{"+endpointsJSON(addrs)+fmt.Sprintf(`,"bodyRouting":%v`, body)+cfg+"}")
}

func TestV8StatePathNeverReachesAnEngine(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			eng := newRecordingEngines(t, 2)
			h := v8Mode(t, eng.addrs, m.body, `,"strategy":"round_robin","state":{"token":"`+stateToken+`"}`)
			want := 200
			if !m.body {
				want = 501
			}
			for _, path := range []string{"/.kvroute/v1/state", "/.kvroute/v1/state/", "/.KVROUTE//v1/stat%65"} {
				code, body := v8Post(t, h.Filtered+path, pushBody(time.Now().UnixMilli(), eng.addrs...), http.Header{"Authorization": {"Bearer " + stateToken}})
				if code != want {
					t.Errorf("%s: %d %s, want %d", path, code, body, want)
				}
			}
			if got := eng.requests(); len(got) != 0 {
				t.Errorf("engines received %d requests to the state path (authorization %q)", len(got), got[0].header.Get("authorization"))
			}
		})
	}
}

func TestV8ShippedWasmPluginPrefixKeyAffinity(t *testing.T) {
	eng := newRecordingEngines(t, 4)
	conf, pc := shippedPluginConfig(t, "../envoy/istio/wasmplugin-header-only.yaml", eng.addrs)
	keyHeader := pc["prefixKeyHeader"].(string)
	h := startV8(t, eng.addrs, conf)
	const keys, per = 4, 6
	for i := range keys * per {
		if code, body := v8Post(t, h.Filtered+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
			http.Header{http.CanonicalHeaderKey(keyHeader): {fmt.Sprintf("key-%d", i%keys)}}); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, body)
		}
	}
	byKey := map[int]map[string]bool{}
	used := map[string]bool{}
	for i, r := range eng.requests() {
		if r.header.Get(keyHeader) != "" {
			t.Fatalf("the engine received %s", keyHeader)
		}
		if byKey[i%keys] == nil {
			byKey[i%keys] = map[string]bool{}
		}
		byKey[i%keys][r.engine], used[r.engine] = true, true
	}
	for k, e := range byKey {
		if len(e) != 1 {
			t.Errorf("key %d went to %d engines, want 1", k, len(e))
		}
	}
	if len(used) < 2 {
		t.Errorf("%d keys all went to %v", keys, used)
	}
}

func TestV8ClientPDFieldsStrippedOnEveryPathAndMode(t *testing.T) {
	pd := `"kv_transfer_params":{"remote_host":"169.254.169.254"},"bootstrap_host":"169.254.169.254","bootstrap_room":7`
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			eng := newRecordingEngines(t, 1)
			h := v8Mode(t, eng.addrs, m.body, `,"fallbacks":0,"testHooks":true`)
			for _, path := range []string{"/v1/chat/completions", "/v1/chat/completion%73", "/v1/chat/completions/", "/V1/chat/completions",
				"/v1//chat/completions", "/invocations", "/v1/responses"} {
				body := `{"model":"m","messages":[{"role":"user","content":"hi"}],` + pd + `}`
				if code, reply := v8Post(t, h.Filtered+path, body, nil); code != 200 {
					t.Errorf("%s: %d %s", path, code, reply)
				}
			}
			// Failing open after a recovered panic strips them too.
			if code, reply := v8Post(t, h.Filtered+"/v1/completions", `{"model":"m","prompt":"hi",`+pd+`}`, http.Header{"X-Kvroute-Test-Panic": {"recover"}}); code != 200 {
				t.Errorf("recovered panic: %d %s", code, reply)
			}
			got := eng.requests()
			if len(got) != 8 {
				t.Fatalf("the engine got %d requests, want 8", len(got))
			}
			for _, r := range got {
				if strings.Contains(r.body, "169.254") || gjson.Get(r.body, "model").Str != "m" {
					t.Errorf("%s: the engine received %q", r.path, r.body)
				}
			}
		})
	}
}

// A model no endpoint serves gets OpenAI's 404 from the filter in V8 too,
// answered from the body callback before any engine sees the request.
func TestV8UnservedModelIs404(t *testing.T) {
	eng := newRecordingEngines(t, 2)
	h := startV8(t, eng.addrs, fmt.Sprintf(`{"endpoints":[{"address":%q,"model":"llama-3-8b"},{"address":%q,"model":"qwen"}],"strategy":"round_robin"}`, eng.addrs[0], eng.addrs[1]))
	code, body := v8Post(t, h.Filtered+"/v1/chat/completions", `{"model":"gpt-x","messages":[{"role":"user","content":"hi"}]}`, nil)
	if want := `{"error":{"message":"The model 'gpt-x' does not exist.","type":"invalid_request_error","param":"model","code":"model_not_found"}}`; code != 404 || body != want {
		t.Errorf("unserved model: %d %s, want 404 %s", code, body, want)
	}
	if code, body := v8Post(t, h.Filtered+"/v1/chat/completions", `{"model":"qwen","messages":[{"role":"user","content":"hi"}]}`, nil); code != 200 {
		t.Errorf("served model: %d %s", code, body)
	}
	if got := eng.requests(); len(got) != 1 || got[0].engine != eng.addrs[1] {
		t.Errorf("engines got %d requests, want only the served model's", len(got))
	}
	if st, err := h.Stats(); err != nil || st.Metrics["kvroute.router.requests.model_not_found"].Value != 1 {
		t.Errorf("requests.model_not_found not counted once (%v)", err)
	}
}

// In V8 too: GET /v1/models/{id} is a local reply from the request
// headers (the model object, or OpenAI's 404 for an id nobody serves), and
// a client's x-data-parallel-rank is removed before the request goes on,
// and counted.
func TestV8ModelObjectAndClientRank(t *testing.T) {
	eng := newRecordingEngines(t, 2)
	h := startV8(t, eng.addrs, fmt.Sprintf(`{"endpoints":[{"address":%q,"model":"meta/llama-3-8b"},{"address":%q,"model":"qwen"}],"strategy":"round_robin"}`, eng.addrs[0], eng.addrs[1]))
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(h.Filtered + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/v1/models/meta/llama-3-8b"); code != 200 || gjson.Get(body, "id").Str != "meta/llama-3-8b" || gjson.Get(body, "object").Str != "model" {
		t.Errorf("GET /v1/models/meta/llama-3-8b: %d %s, want the model object", code, body)
	}
	if code, body := get("/v1/models/gpt-x"); code != 404 || gjson.Get(body, "error.code").Str != "model_not_found" {
		t.Errorf("GET /v1/models/gpt-x: %d %s, want 404 model_not_found", code, body)
	}
	code, body := v8Post(t, h.Filtered+"/v1/completions", `{"model":"qwen","prompt":"hi"}`, http.Header{"X-Data-Parallel-Rank": {"9"}})
	if code != 200 {
		t.Fatalf("completion: %d %s", code, body)
	}
	got := eng.requests()
	if len(got) != 1 {
		t.Fatalf("engines got %d requests, want only the completion", len(got))
	}
	if v := got[0].header.Get("X-Data-Parallel-Rank"); v != "" {
		t.Errorf("the engine saw the client's rank header %q", v)
	}
	st, err := h.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Metrics["kvroute.router.client_rank_header_removed"].Value != 1 || st.Metrics["kvroute.router.requests.model_not_found"].Value != 1 {
		t.Errorf("client_rank_header_removed %v, requests.model_not_found %v; want 1 and 1",
			st.Metrics["kvroute.router.client_rank_header_removed"].Value, st.Metrics["kvroute.router.requests.model_not_found"].Value)
	}
}

// Bad input about models, adapters and ranks in V8, where the answer is a
// local reply from the body callback: an adapter nobody serves gets 404, a
// model whose every host the push marks unhealthy gets 503 (not an engine
// of another model), and a push naming a rank outside its endpoint's
// ranks gets 400 naming the field and changes nothing. Each is counted.
func TestV8BadModelAdapterAndRank(t *testing.T) {
	eng := newRecordingEngines(t, 2)
	h := startV8(t, eng.addrs, fmt.Sprintf(`{"endpoints":[{"address":%q,"model":"llama-3-8b"},{"address":%q,"model":"qwen"}],
		"strategy":"round_robin","loraAdapters":{"fin-lora":"llama-3-8b"},"state":{"token":%q}}`, eng.addrs[0], eng.addrs[1], stateToken))
	auth := http.Header{"Authorization": {"Bearer " + stateToken}}
	push := func(hosts string) (int, string) {
		t.Helper()
		time.Sleep(2 * time.Millisecond)
		return v8Post(t, h.Filtered+"/.kvroute/v1/state", fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[%s]}`, time.Now().UnixMilli(), hosts), auth)
	}
	if code, body := v8Post(t, h.Filtered+"/v1/completions", `{"model":"no-such-lora","prompt":"hi"}`, nil); code != 404 || gjson.Get(body, "error.code").Str != "model_not_found" {
		t.Errorf("unknown adapter: %d %s, want 404 model_not_found", code, body)
	}
	if code, body := push(fmt.Sprintf(`{"address":%q,"model":"llama-3-8b","healthy":false},{"address":%q,"model":"qwen","healthy":true}`, eng.addrs[0], eng.addrs[1])); code != 200 {
		t.Fatalf("push: %d %s", code, body)
	}
	for _, m := range []string{"llama-3-8b", "fin-lora"} {
		code, body := v8Post(t, h.Filtered+"/v1/completions", `{"model":"`+m+`","prompt":"hi"}`, nil)
		if code != 503 || gjson.Get(body, "error.code").Str != "model_unavailable" || !strings.Contains(gjson.Get(body, "error.message").Str, "'"+m+"'") {
			t.Errorf("%s with no healthy host: %d %s, want 503 model_unavailable naming it", m, code, body)
		}
	}
	code, body := push(fmt.Sprintf(`{"address":%q,"model":"llama-3-8b","healthy":true,"dataParallelSize":2,"rank":0},{"address":%q,"model":"llama-3-8b","healthy":true,"dataParallelSize":2,"rank":2}`, eng.addrs[0], eng.addrs[0]))
	if code != 400 || !strings.Contains(body, "hosts[1].rank") {
		t.Errorf("a rank outside the endpoint's: %d %s, want 400 naming hosts[1].rank", code, body)
	}
	// The refused push changed nothing: llama-3-8b still has no healthy host.
	if code, _ := v8Post(t, h.Filtered+"/v1/completions", `{"model":"llama-3-8b","prompt":"hi"}`, nil); code != 503 {
		t.Errorf("after the refused push: %d, want 503 as before it", code)
	}
	if got := eng.requests(); len(got) != 0 {
		t.Errorf("engines got %d requests, want none", len(got))
	}
	st, err := h.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{"kvroute.router.requests.model_not_found": 1,
		"kvroute.router.requests.model_unavailable": 3, "kvroute.router.state.rejected": 1} {
		if got := st.Metrics[name].Value; got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}
