package filter

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/filter/statnames"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/scorer"
)

// modelList is OpenAI's model list as a client reads it.
type modelList struct {
	Object string `json:"object"`
	Data   []struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
		Parent  string `json:"parent"`
	} `json:"data"`
}

// GET /v1/models is answered by the gateway from the pushed state: each
// served model once, a host's LoRA adapters with their base model as
// parent (as vLLM lists them), a configured adapter whose base is served;
// it never reaches an engine, and is not a routed request.
func TestWasmModelsListFromPushedState(t *testing.T) {
	addrs := jsonUpstreams(t, 3, `{"choices":[{"text":"ok"}]}`)
	h, url := startRouter(t, addrs, 1, `,"loraAdapters":{"sql-lora":"qwen-7b","orphan-lora":"llama-2-7b"},"state":{"token":"`+stateToken+`"}`)
	push := fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[
		{"address":%q,"model":"llama-3-8b","adapters":["fin-lora"]},
		{"address":%q,"model":"qwen-7b"},
		{"address":%q,"model":"llama-3-8b","adapters":["fin-lora"]}]}`, time.Now().UnixMilli(), addrs[0], addrs[1], addrs[2])
	if code, body, _ := testenv.Call(t, "POST", url+"/.kvroute/v1/state", push, map[string]string{"authorization": "Bearer " + stateToken}); code != 200 {
		t.Fatalf("push: %d %s", code, body)
	}
	before := h.UpstreamRequests()
	code, body, _ := testenv.Call(t, "GET", url+"/v1/models", "", nil)
	if code != 200 {
		t.Fatalf("GET /v1/models: %d %s", code, body)
	}
	var l modelList
	if err := json.Unmarshal([]byte(body), &l); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	got := map[string]string{}
	for _, m := range l.Data {
		if _, dup := got[m.ID]; dup {
			t.Errorf("%s listed twice in %s", m.ID, body)
		}
		got[m.ID] = m.Parent
		if m.Object != "model" || m.OwnedBy != "kvroute" || m.Created < time.Now().Add(-time.Hour).Unix() {
			t.Errorf("entry %+v: want object model, owned_by kvroute, created now", m)
		}
	}
	want := map[string]string{"llama-3-8b": "", "qwen-7b": "", "fin-lora": "llama-3-8b", "sql-lora": "qwen-7b"}
	if l.Object != "list" || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("model list %s: ids and parents %v, want %v", body, got, want)
	}
	after := h.UpstreamRequests()
	for _, a := range addrs {
		if after[a] != before[a] {
			t.Errorf("GET /v1/models reached engine %s", a)
		}
	}
	if n := h.CounterValue("kvroute.router.requests.routed"); n != 0 {
		t.Errorf("requests.routed = %d after a model list, want 0", n)
	}
}

// With "passthrough", or with endpoints that name no model (auto), an
// engine answers GET /v1/models; "local" answers even an empty list.
func TestWasmModelsAnswerConfig(t *testing.T) {
	for _, tc := range []struct {
		name, cfg, model string
		engine           bool
		want             string
	}{
		{"passthrough", `"models":{"answer":"passthrough"},`, "m", true, ""},
		{"auto, no model named", ``, "", true, ""},
		{"auto, a model named", ``, "m", false, `{"object":"list","data":[{"id":"m"`},
		{"local, no model named", `"models":{"answer":"local"},`, "", false, `{"object":"list","data":[]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := newRecordingEngines(t, 1)
			_, url := startConfig(t, eng.addrs, true, fmt.Sprintf(`{%s"endpoints":[{"address":%q,"model":%q}]}`, tc.cfg, eng.addrs[0], tc.model))
			code, body, _ := testenv.Call(t, "GET", url+"/v1/models", "", nil)
			if reached := len(eng.requests()) == 1; reached != tc.engine || code != 200 {
				t.Fatalf("%d %s; engine reached %v, want %v", code, body, reached, tc.engine)
			}
			if !tc.engine && (len(body) < len(tc.want) || body[:len(tc.want)] != tc.want) {
				t.Errorf("answer %s, want it to start %s", body, tc.want)
			}
		})
	}
}

// Routed requests are counted per model (tag kvroute_model): a model the
// candidates name under its own value, a model they do not name (served
// by a host that names none) as "other", so clients cannot make series.
// After a push that drops a model, its requests count as "other".
func TestWasmRoutedRequestsByModel(t *testing.T) {
	addrs := jsonUpstreams(t, 3, `{"choices":[{"text":"ok"}]}`)
	h, url := startRouter(t, addrs, 1, `,"strategy":"round_robin","state":{"token":"`+stateToken+`"}`)
	auth := map[string]string{"authorization": "Bearer " + stateToken}
	push := func(hosts string) {
		t.Helper()
		st := fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[%s]}`, time.Now().UnixMilli(), hosts)
		if code, body, _ := testenv.Call(t, "POST", url+"/.kvroute/v1/state", st, auth); code != 200 {
			t.Fatalf("push: %d %s", code, body)
		}
	}
	send := func(model string, n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			if code, body, _ := testenv.Call(t, "POST", url+"/v1/completions", `{"model":"`+model+`","prompt":"hello"}`, nil); code != 200 {
				t.Fatalf("%s: %d %s", model, code, body)
			}
		}
	}
	byModel := func(tag string) int64 {
		return h.CounterValue(statnames.Tagged(statnames.Router+"model.", statnames.TagModel, tag, "requests"))
	}
	push(fmt.Sprintf(`{"address":%q,"model":"llama-3-8b"},{"address":%q,"model":"meta/qwen-7b"},{"address":%q}`, addrs[0], addrs[1], addrs[2]))
	send("llama-3-8b", 3)
	send("meta/qwen-7b", 2)
	send("made-up-1", 1)
	send("made-up-2", 1)
	send("llama-3-8b", 1)
	if a, b, o := byModel("llama-3-8b"), byModel("meta/qwen-7b"), byModel("other"); a != 4 || b != 2 || o != 2 {
		t.Errorf("routed by model: llama-3-8b %d, meta/qwen-7b %d, other %d; want 4, 2, 2", a, b, o)
	}
	if byModel("made-up-1") != 0 {
		t.Error("a model no candidate names got its own series")
	}
	push(fmt.Sprintf(`{"address":%q,"model":"meta/qwen-7b"},{"address":%q}`, addrs[1], addrs[2]))
	send("llama-3-8b", 1)
	if a, o := byModel("llama-3-8b"), byModel("other"); a != 4 || o != 3 {
		t.Errorf("after llama-3-8b left the state: llama-3-8b %d, other %d; want 4, 3", a, o)
	}
}

// GET /v1/models/{id} is answered as OpenAI (and vLLM's list entries)
// answer it: the model object, an adapter's with its base model as
// parent, an id holding a slash or percent-escapes read as an HTTP server
// reads it; an id nobody serves gets OpenAI's 404 model_not_found,
// counted. None reaches an engine or counts as routed.
func TestWasmModelObject(t *testing.T) {
	addrs := jsonUpstreams(t, 2, `{"choices":[{"text":"ok"}]}`)
	h, url := startRouter(t, addrs, 1, `,"loraAdapters":{"sql-lora":"meta/qwen-7b"},"state":{"token":"`+stateToken+`"}`)
	push := fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[
		{"address":%q,"model":"llama-3-8b","adapters":["fin-lora"]},
		{"address":%q,"model":"meta/qwen-7b"}]}`, time.Now().UnixMilli(), addrs[0], addrs[1])
	if code, body, _ := testenv.Call(t, "POST", url+"/.kvroute/v1/state", push, map[string]string{"authorization": "Bearer " + stateToken}); code != 200 {
		t.Fatalf("push: %d %s", code, body)
	}
	before := h.UpstreamRequests()
	for _, c := range []struct{ path, id, parent string }{
		{"/v1/models/llama-3-8b", "llama-3-8b", ""},
		{"/v1/models/meta/qwen-7b", "meta/qwen-7b", ""},
		{"/v1/models/meta%2Fqwen-7b", "meta/qwen-7b", ""},
		{"//V1/Models/llama-3-8b?x=1", "llama-3-8b", ""},
		{"/v1/models/fin-lora", "fin-lora", "llama-3-8b"},
		{"/v1/models/sql-lora", "sql-lora", "meta/qwen-7b"},
	} {
		code, body, _ := testenv.Call(t, "GET", url+c.path, "", nil)
		var m struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Created int64  `json:"created"`
			OwnedBy string `json:"owned_by"`
			Parent  string `json:"parent"`
		}
		if err := json.Unmarshal([]byte(body), &m); err != nil || code != 200 {
			t.Errorf("GET %s: %d %s (%v)", c.path, code, body, err)
			continue
		}
		if m.ID != c.id || m.Object != "model" || m.OwnedBy != "kvroute" || m.Parent != c.parent || m.Created < time.Now().Add(-time.Hour).Unix() {
			t.Errorf("GET %s: %s, want id %q, object model, owned_by kvroute, parent %q, created now", c.path, body, c.id, c.parent)
		}
	}
	const want404 = `{"error":{"message":"The model 'LLAMA-3-8B' does not exist.","type":"invalid_request_error","param":"model","code":"model_not_found"}}`
	if code, body, _ := testenv.Call(t, "GET", url+"/v1/models/LLAMA-3-8B", "", nil); code != 404 || body != want404 {
		t.Errorf("unknown id: %d %s, want 404 %s", code, body, want404)
	}
	if code, body, _ := testenv.Call(t, "GET", url+"/v1/models/orphan", "", nil); code != 404 || !strings.Contains(body, `"code":"model_not_found"`) {
		t.Errorf("unknown id: %d %s, want 404 model_not_found", code, body)
	}
	if got := h.CounterValue("kvroute.router.requests.model_not_found"); got != 2 {
		t.Errorf("requests.model_not_found = %d, want 2", got)
	}
	after := h.UpstreamRequests()
	for _, a := range addrs {
		if after[a] != before[a] {
			t.Errorf("GET /v1/models/{id} reached engine %s", a)
		}
	}
	if n := h.CounterValue("kvroute.router.requests.routed"); n != 0 {
		t.Errorf("requests.routed = %d after model lookups, want 0", n)
	}
}

// With "passthrough" an engine answers GET /v1/models/{id}, as it answers
// the list.
func TestWasmModelObjectPassthrough(t *testing.T) {
	eng := newRecordingEngines(t, 1)
	_, url := startConfig(t, eng.addrs, true, fmt.Sprintf(`{"models":{"answer":"passthrough"},"endpoints":[{"address":%q,"model":"m"}]}`, eng.addrs[0]))
	if code, body, _ := testenv.Call(t, "GET", url+"/v1/models/m", "", nil); code != 200 || len(eng.requests()) != 1 {
		t.Fatalf("%d %s; engine requests %d, want the engine to answer", code, body, len(eng.requests()))
	}
}

// A model whose every host is unhealthy gets 503, OpenAI-style, counted,
// instead of going to an engine of another model; the other model is
// served as before, and the model comes back with a healthy push.
func TestWasmModelWithNoHealthyHost(t *testing.T) {
	addrs := jsonUpstreams(t, 3, `{"choices":[{"text":"ok"}]}`)
	h, url := startRouter(t, addrs, 1, `,"state":{"token":"`+stateToken+`"}`)
	push := func(healthy bool) {
		t.Helper()
		time.Sleep(2 * time.Millisecond)
		st := fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[
			{"address":%q,"model":"llama-3-8b","healthy":%v},
			{"address":%q,"model":"llama-3-8b","healthy":%v},
			{"address":%q,"model":"qwen-7b","healthy":true}]}`, time.Now().UnixMilli(), addrs[0], healthy, addrs[1], healthy, addrs[2])
		if code, body, _ := testenv.Call(t, "POST", url+"/.kvroute/v1/state", st, map[string]string{"authorization": "Bearer " + stateToken}); code != 200 {
			t.Fatalf("push: %d %s", code, body)
		}
	}
	push(false)
	before := h.UpstreamRequests()
	code, body, _ := testenv.Call(t, "POST", url+"/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":2}`, nil)
	const want = `{"error":{"message":"The model 'llama-3-8b' has no healthy replica right now (every engine serving it failed its health checks or has its circuit breaker open); retry later.","type":"service_unavailable_error","param":"model","code":"model_unavailable"}}`
	if code != 503 || body != want {
		t.Errorf("model with no healthy host: %d %s, want 503 %s", code, body, want)
	}
	if after := h.UpstreamRequests(); after[addrs[2]] != before[addrs[2]] {
		t.Errorf("the request went to qwen-7b's engine")
	}
	if got := h.CounterValue("kvroute.router.requests.model_unavailable"); got != 1 {
		t.Errorf("requests.model_unavailable = %d, want 1", got)
	}
	if got := h.CounterValue(statnames.Tagged(statnames.Router+"requests.", statnames.TagReason, "unavailable", "rejected")); got != 1 {
		t.Errorf("requests.rejected{unavailable} = %d, want 1", got)
	}
	if code, body, _ := testenv.Call(t, "POST", url+"/v1/completions", `{"model":"qwen-7b","prompt":"hi","max_tokens":2}`, nil); code != 200 {
		t.Errorf("qwen-7b: %d %s", code, body)
	}
	push(true)
	if code, body, _ := testenv.Call(t, "POST", url+"/v1/completions", `{"model":"llama-3-8b","prompt":"hi","max_tokens":2}`, nil); code != 200 {
		t.Errorf("llama-3-8b healthy again: %d %s", code, body)
	}
}

// A push naming a data-parallel rank its endpoint does not have is refused
// whole through the Wasm host: 400 naming the field, state.rejected, and
// the candidates stay those of the last good push.
func TestWasmPushedRankOutsideEndpointRefused(t *testing.T) {
	addrs := jsonUpstreams(t, 2, `{"choices":[{"text":"ok"}]}`)
	h, url := startRouter(t, addrs, 1, `,"fallbacks":0,"state":{"token":"`+stateToken+`"}`)
	auth := map[string]string{"authorization": "Bearer " + stateToken}
	push := func(hosts string) (int, string) {
		t.Helper()
		time.Sleep(2 * time.Millisecond)
		code, body, _ := testenv.Call(t, "POST", url+"/.kvroute/v1/state", fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[%s]}`, time.Now().UnixMilli(), hosts), auth)
		return code, body
	}
	if code, body := push(fmt.Sprintf(`{"address":%q,"healthy":true}`, addrs[1])); code != 200 {
		t.Fatalf("push: %d %s", code, body)
	}
	code, body := push(fmt.Sprintf(`{"address":%q,"healthy":true,"dataParallelSize":2,"rank":0},{"address":%q,"healthy":true,"dataParallelSize":2,"rank":2}`, addrs[0], addrs[0]))
	if code != 400 || !strings.Contains(body, "hosts[1].rank: 2 is not a rank of the endpoint's 2 data-parallel ranks") {
		t.Errorf("rank 2 of 2: %d %s, want 400 naming hosts[1].rank", code, body)
	}
	if got := h.CounterValue("kvroute.router.state.rejected"); got != 1 {
		t.Errorf("state.rejected = %d, want 1", got)
	}
	before := h.UpstreamRequests()
	for i := range 4 {
		if code, body, _ := testenv.Call(t, "POST", url+"/v1/completions", fmt.Sprintf(`{"model":"m","prompt":"q%d"}`, i), nil); code != 200 {
			t.Fatalf("request: %d %s", code, body)
		}
	}
	if after := h.UpstreamRequests(); after[addrs[1]]-before[addrs[1]] != 4 {
		t.Errorf("requests went to %v, want all 4 on %s, the last good push's only host", after, addrs[1])
	}
}

// Whether a model has a usable host reads "serves" as servesModel does: a
// host of the model, a host naming no model, or a host listing the model
// as a LoRA adapter; only healthy hosts with their breaker closed count.
// (A request filtered out for another reason, with a usable host, keeps
// Envoy's fallback and requests.no_candidate instead of a 503 whose
// message would be false.)
func TestModelUsable(t *testing.T) {
	p := &routerPlugin{hosts: []scorer.Host{
		{Address: "a", Model: "llama", Adapters: []string{"fin-lora"}},
		{Address: "b", Model: "qwen", Unhealthy: true},
		{Address: "c", Model: "mistral", BreakerOpen: true},
	}}
	for model, want := range map[string]bool{"llama": true, "fin-lora": true, "qwen": false, "mistral": false} {
		if got := p.modelUsable(model); got != want {
			t.Errorf("modelUsable(%q) = %v, want %v", model, got, want)
		}
	}
	p.hosts = append(p.hosts, scorer.Host{Address: "d"}) // serves any model
	if !p.modelUsable("qwen") {
		t.Error("a healthy host naming no model serves qwen too")
	}
}
