package filter

import (
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/tidwall/gjson"

	"github.com/kvroute/kvroute/filter/statnames"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/openai"
)

const threeEndpoints = `{"endpoints":[{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"},{"address":"10.0.0.3:8000"}]`

// newHost starts an emulated plugin with root id rootID and configuration cfg
// and fails the test unless start returns want. It returns the router plugin
// when one started.
func newHost(t testing.TB, rootID, cfg string, want types.OnPluginStartStatus) (proxytest.HostEmulator, *routerPlugin) {
	t.Helper()
	return newHostWith(t, Options{}, rootID, cfg, want)
}

// newHostWith is newHost with opts (Emulated is always set: the host is
// the SDK's emulator).
func newHostWith(t testing.TB, opts Options, rootID, cfg string, want types.OnPluginStartStatus) (proxytest.HostEmulator, *routerPlugin) {
	t.Helper()
	var started *routerPlugin
	opts.started = func(p *routerPlugin) { started = p }
	opts.Emulated = true
	opt := proxytest.NewEmulatorOption().
		WithVMContext(NewVMContextWith("test", opts)).
		WithPluginConfiguration([]byte(cfg)).
		WithProperty([]string{"plugin_root_id"}, []byte(rootID))
	host, reset := proxytest.NewHostEmulator(opt)
	t.Cleanup(reset)
	if got := host.StartPlugin(); got != want {
		t.Fatalf("StartPlugin = %v, want %v; critical logs: %v", got, want, host.GetCriticalLogs())
	}
	return host, started
}

func header(hs [][2]string, name string) (string, int) {
	var v string
	n := 0
	for _, h := range hs {
		if strings.EqualFold(h[0], name) {
			v = h[1]
			n++
		}
	}
	return v, n
}

func counter(t *testing.T, host proxytest.HostEmulator, name string) uint64 {
	t.Helper()
	v, err := host.GetCounterMetric(name)
	if err != nil {
		t.Fatalf("metric %s: %v", name, err)
	}
	return v
}

const completion = `{"model":"m","prompt":"You are a helpful assistant. Answer briefly.","max_tokens":16}`

// send runs one request's request side: headers, then the body (if any) in
// one chunk. It returns the stream id and the last action.
func send(host proxytest.HostEmulator, method, path, body string, extra ...[2]string) (uint32, types.Action) {
	id := host.InitializeHttpContext()
	hs := append([][2]string{{":method", method}, {":path", path}, {":authority", "gw"}}, extra...)
	action := host.CallOnRequestHeaders(id, hs, body == "")
	if action != types.ActionPause || body == "" {
		return id, action
	}
	return id, host.CallOnRequestBody(id, []byte(body), true)
}

func post(host proxytest.HostEmulator, body string, extra ...[2]string) (uint32, types.Action) {
	return send(host, "POST", "/v1/completions", body, extra...)
}

func destination(host proxytest.HostEmulator, id uint32) string {
	v, _ := header(host.GetCurrentRequestHeaders(id), "x-gateway-destination-endpoint")
	return v
}

func TestRouterRoundRobinWithFallbacks(t *testing.T) {
	host, _ := newHost(t, RootRouter, threeEndpoints+`,"strategy":"round_robin","fallbacks":1}`, types.OnPluginStartStatusOK)
	seen := map[string]int{}
	for i := 0; i < 6; i++ {
		id, action := post(host, completion)
		if action != types.ActionContinue {
			t.Fatalf("request %d: action %v, want Continue", i, action)
		}
		d := strings.Split(destination(host, id), ",")
		if len(d) != 2 || d[0] == d[1] {
			t.Fatalf("request %d: destination %v, want primary and one distinct fallback", i, d)
		}
		seen[d[0]]++
	}
	for _, a := range []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"} {
		if seen[a] != 2 {
			t.Errorf("primaries = %v, want each endpoint twice", seen)
		}
	}
	if got := counter(t, host, "kvroute.router.requests.routed"); got != 6 {
		t.Errorf("routed = %d, want 6", got)
	}
	if got := counter(t, host, statnames.Tagged(statnames.Router+"profile.", statnames.TagProfile, "round_robin", "requests")); got != 6 {
		t.Errorf("profile counter = %d, want 6", got)
	}
}

func TestRouterStripsClientRoutingHeaders(t *testing.T) {
	host, _ := newHost(t, RootRouter, threeEndpoints+`,"fallbacks":0}`, types.OnPluginStartStatusOK)
	id, _ := post(host, completion,
		[2]string{"x-gateway-destination-endpoint", "169.254.169.254:80"},
		[2]string{"X-Gateway-Destination-Endpoint", "10.0.0.3:8000"},
		[2]string{"x-kvroute-prefill-host", "169.254.169.254:80"},
		[2]string{"x-kvroute-test-panic", "recover"}, // testHooks off: just stripped
		[2]string{"x-other", "kept"})
	hs := host.GetCurrentRequestHeaders(id)
	if got, n := header(hs, "x-gateway-destination-endpoint"); n != 1 || !strings.HasPrefix(got, "10.0.0.") {
		t.Errorf("destination = %q (%d values), want only the filter's choice", got, n)
	}
	for _, h := range hs {
		if strings.HasPrefix(h[0], "x-kvroute-") {
			t.Errorf("internal header %s reached the upstream", h[0])
		}
	}
	if got, _ := header(hs, "x-other"); got != "kept" {
		t.Errorf("unrelated header lost: %v", hs)
	}
	if got := counter(t, host, "kvroute.router.recovered_panics"); got != 0 {
		t.Errorf("test hook fired with testHooks off: recovered_panics = %d", got)
	}
}

func TestHeaderOnlyMode(t *testing.T) {
	host, _ := newHost(t, RootRouter, threeEndpoints+`,"bodyRouting":false,"strategy":"round_robin","fallbacks":0}`, types.OnPluginStartStatusOK)
	got := map[string]bool{}
	for i := 0; i < 3; i++ {
		id := host.InitializeHttpContext()
		action := host.CallOnRequestHeaders(id, [][2]string{{":method", "POST"}, {":path", "/v1/chat/completions"}, {"x-gateway-destination-endpoint", "1.2.3.4:5"}}, false)
		if action != types.ActionContinue {
			t.Fatalf("header-only mode must not pause, got %v", action)
		}
		got[destination(host, id)] = true
	}
	if len(got) != 3 || got["1.2.3.4:5"] {
		t.Errorf("header-only destinations = %v, want the three endpoints", got)
	}
}

func TestOtherPathsPassThroughUntouched(t *testing.T) {
	host, _ := newHost(t, RootRouter, threeEndpoints+`}`, types.OnPluginStartStatusOK)
	id, action := send(host, "GET", "/v1/models", "", [2]string{"x-gateway-destination-endpoint", "10.0.0.2:8000"})
	if action != types.ActionContinue {
		t.Fatalf("action %v", action)
	}
	// The client's routing header is still removed; nothing is set.
	if d := destination(host, id); d != "" {
		t.Errorf("pass-through request got destination %q", d)
	}
	if got := counter(t, host, "kvroute.router.requests.pass_through"); got != 1 {
		t.Errorf("pass_through = %d", got)
	}
}

func TestRejectOtherPaths(t *testing.T) {
	host2, _ := newHost(t, RootRouter, threeEndpoints+`,"rejectOtherPaths":true}`, types.OnPluginStartStatusOK)
	id, _ := send(host2, "GET", "/admin", "")
	if r := host2.GetSentLocalResponse(id); r == nil || r.StatusCode != 404 {
		t.Errorf("rejectOtherPaths: reply %+v, want 404", r)
	}
}

func TestPluginStartFailsOnBadConfigNamingTheField(t *testing.T) {
	host, _ := newHost(t, RootRouter, `{"endpoints":[{"address":"10.0.0.1:8000"},{"address":"10.0.0.2"}]}`, types.OnPluginStartStatusFailed)
	logs := strings.Join(host.GetCriticalLogs(), "\n")
	if !strings.Contains(logs, "kvroute.router: invalid plugin configuration: endpoints[1].address") {
		t.Errorf("critical log does not name the field: %q", logs)
	}
}

func TestPluginStartFailsOnBadStrategy(t *testing.T) {
	host, _ := newHost(t, RootRouter, `{"strategy":"fastest"}`, types.OnPluginStartStatusFailed)
	if logs := strings.Join(host.GetCriticalLogs(), "\n"); !strings.Contains(logs, `strategy: unknown strategy "fastest"`) {
		t.Errorf("critical log = %q", logs)
	}
}

func TestPluginStartFailsOnUnknownRootID(t *testing.T) {
	host, _ := newHost(t, "kvroute.routr", `{}`, types.OnPluginStartStatusFailed)
	if logs := strings.Join(host.GetCriticalLogs(), "\n"); !strings.Contains(logs, `unknown root id "kvroute.routr"`) {
		t.Errorf("critical log = %q", logs)
	}
}

func TestTestHookRecoverFailsOpen(t *testing.T) {
	host, _ := newHost(t, RootRouter, threeEndpoints+`,"fallbacks":0,"testHooks":true}`, types.OnPluginStartStatusOK)
	id, action := post(host, completion,
		[2]string{"x-kvroute-test-panic", "recover"},
		[2]string{"x-gateway-destination-endpoint", "169.254.169.254:80"})
	if action != types.ActionContinue {
		t.Fatalf("action after recovered panic = %v, want Continue", action)
	}
	if got := destination(host, id); !strings.HasPrefix(got, "10.0.0.") {
		t.Errorf("after fail-open destination = %q, want a least-loaded endpoint (never the client's)", got)
	}
	if got := counter(t, host, "kvroute.router.recovered_panics"); got != 1 {
		t.Errorf("recovered_panics = %d, want 1", got)
	}
	if got := counter(t, host, "kvroute.router.requests.failed_open"); got != 1 {
		t.Errorf("failed_open = %d, want 1", got)
	}
	if logs := strings.Join(host.GetErrorLogs(), "\n"); !strings.Contains(logs, "recovered panic in kvroute.router on_request_headers") {
		t.Errorf("error logs = %q", logs)
	}
	id, action = post(host, completion)
	if action != types.ActionContinue || destination(host, id) == "" {
		t.Errorf("next request not routed: action %v, destination %q", action, destination(host, id))
	}
}

func TestTestHookTrapIsNotRecovered(t *testing.T) {
	host, _ := newHost(t, RootRouter, threeEndpoints+`,"testHooks":true}`, types.OnPluginStartStatusOK)
	defer func() {
		r := recover()
		if _, ok := r.(trapPanic); !ok {
			t.Errorf("want the trap hook's panic to escape the callback, got %v", r)
		}
		if got := counter(t, host, "kvroute.router.recovered_panics"); got != 0 {
			t.Errorf("trap counted as recovered: %d", got)
		}
	}()
	post(host, completion, [2]string{"x-kvroute-test-panic", "trap"})
	t.Error("trap hook returned normally")
}

// badInputs is the documented outcome of each malformed request: the status
// the client gets (never an engine), and the parameter the error names.
var badInputs = []struct {
	name, method, path, body string
	chunks                   int // >1 sends the body in that many chunks
	status                   int
	param                    string
}{
	{"truncated JSON", "POST", "/v1/completions", `{"model":"m","prompt":"hel`, 1, 400, ""},
	{"not an object", "POST", "/v1/completions", `["m","hello"]`, 1, 400, ""},
	{"missing model", "POST", "/v1/completions", `{"prompt":"hello"}`, 1, 400, "model"},
	{"model wrong type", "POST", "/v1/completions", `{"model":7,"prompt":"hello"}`, 1, 400, "model"},
	{"missing prompt", "POST", "/v1/completions", `{"model":"m"}`, 1, 400, "prompt"},
	{"prompt wrong type", "POST", "/v1/completions", `{"model":"m","prompt":{"text":"x"}}`, 1, 400, "prompt"},
	{"empty prompt", "POST", "/v1/completions", `{"model":"m","prompt":""}`, 1, 400, "prompt"},
	{"negative token id", "POST", "/v1/completions", `{"model":"m","prompt":[1,-2,3]}`, 1, 400, "prompt"},
	{"fractional token id", "POST", "/v1/completions", `{"model":"m","prompt":[1,2.5]}`, 1, 400, "prompt"},
	{"max_tokens wrong type", "POST", "/v1/completions", `{"model":"m","prompt":"x","max_tokens":"9"}`, 1, 400, "max_tokens"},
	{"stream wrong type", "POST", "/v1/completions", `{"model":"m","prompt":"x","stream":"yes"}`, 1, 400, "stream"},
	{"messages not an array", "POST", "/v1/chat/completions", `{"model":"m","messages":"hi"}`, 1, 400, "messages"},
	{"empty messages", "POST", "/v1/chat/completions", `{"model":"m","messages":[]}`, 1, 400, "messages"},
	{"message without role", "POST", "/v1/chat/completions", `{"model":"m","messages":[{"content":"hi"}]}`, 1, 400, "messages[0].role"},
	{"content wrong type", "POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":5}]}`, 1, 400, "messages[0].content"},
	{"part without text", "POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]}`, 1, 400, "messages[0].content[0].text"},
	{"invalid UTF-8", "POST", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"\xff\xfe\"}", 1, 400, ""},
	{"empty body", "POST", "/v1/completions", "", 1, 400, ""},
	{"GET on an inference path", "GET", "/v1/completions", "", 1, 405, ""},
	{"oversized body", "POST", "/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("a", 5000) + `"}`, 1, 413, ""},
	{"oversized chunked body", "POST", "/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("a", 5000) + `"}`, 5, 413, ""},
	// Valid requests that look unusual: they route.
	{"chunked body", "POST", "/v1/completions", completion, 4, 0, ""},
	{"token-id prompt", "POST", "/v1/completions", `{"model":"m","prompt":[101,2023,2003,1037,3231]}`, 1, 0, ""},
	{"batch of token-id prompts", "POST", "/v1/completions", `{"model":"m","prompt":[[1,2],[3,4]]}`, 1, 0, ""},
	{"huge messages array", "POST", "/v1/chat/completions", `{"model":"m","messages":[` + strings.Repeat(`{"role":"user","content":"hi"},`, 120) + `{"role":"user","content":"end"}]}`, 1, 0, ""},
	{"multimodal and tools", "POST", "/v1/chat/completions", `{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"https://x/y.png"}}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}]}`, 1, 0, ""},
	{"embeddings", "POST", "/v1/embeddings", `{"model":"m","input":["a","b"]}`, 1, 0, ""},
}

func TestBadInputTable(t *testing.T) {
	host, _ := newHost(t, RootRouter, threeEndpoints+`,"maxBodyBytes":4096}`, types.OnPluginStartStatusOK)
	for _, tc := range badInputs {
		id := host.InitializeHttpContext()
		hs := [][2]string{{":method", tc.method}, {":path", tc.path}}
		action := host.CallOnRequestHeaders(id, hs, tc.body == "")
		if action == types.ActionPause && tc.body != "" {
			step := (len(tc.body) + tc.chunks - 1) / tc.chunks
			for off := 0; off < len(tc.body) && host.GetSentLocalResponse(id) == nil; off += step {
				end := min(off+step, len(tc.body))
				action = host.CallOnRequestBody(id, []byte(tc.body[off:end]), end == len(tc.body))
			}
		}
		reply := host.GetSentLocalResponse(id)
		if tc.status == 0 {
			if reply != nil || action != types.ActionContinue || destination(host, id) == "" {
				t.Errorf("%s: want routed, got reply %+v, action %v, destination %q", tc.name, reply, action, destination(host, id))
			}
			continue
		}
		if reply == nil || int(reply.StatusCode) != tc.status {
			t.Errorf("%s: want %d, got %+v (action %v)", tc.name, tc.status, reply, action)
			continue
		}
		if destination(host, id) != "" {
			t.Errorf("%s: a rejected request got a destination", tc.name)
		}
		body := string(reply.Data)
		if gjson.Get(body, "error.type").String() != "invalid_request_error" || gjson.Get(body, "error.message").String() == "" {
			t.Errorf("%s: body %s is not an OpenAI-style error", tc.name, body)
		}
		if got := gjson.Get(body, "error.param").String(); got != tc.param {
			t.Errorf("%s: error.param = %q, want %q (%s)", tc.name, got, tc.param, body)
		}
		if strings.Contains(body, "helpful") || strings.Contains(body, "aaaa") {
			t.Errorf("%s: error body echoes prompt text: %s", tc.name, body)
		}
	}
	// The VM is still healthy: a normal request routes, nothing panicked.
	if id, action := post(host, completion); action != types.ActionContinue || destination(host, id) == "" {
		t.Errorf("after the bad inputs a good request was not routed")
	}
	if got := counter(t, host, "kvroute.router.recovered_panics"); got != 0 {
		t.Errorf("recovered_panics = %d: some bad input panicked", got)
	}
	if got := counter(t, host, "kvroute.router.parse_errors"); got < 10 {
		t.Errorf("parse_errors = %d", got)
	}
}

const stateToken = "s3cret-token"

func pushBody(ts int64, addrs ...string) string {
	return pushBodyRaw(strconv.FormatInt(ts, 10), addrs...)
}

// pushBodyRaw is pushBody with the timestamp as written in the JSON.
func pushBodyRaw(ts string, addrs ...string) string {
	var hs []string
	for _, a := range addrs {
		hs = append(hs, fmt.Sprintf(`{"address":%q,"healthy":true,"waiting":0,"running":1,"kvUsage":0.2}`, a))
	}
	return fmt.Sprintf(`{"version":1,"timestampMs":%s,"hosts":[%s]}`, ts, strings.Join(hs, ","))
}

func TestStateEndpointAuthAndValidation(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	host, p := newHostWith(t, Options{Clock: func() time.Time { return now }}, RootRouter, threeEndpoints+`,"strategy":"round_robin","fallbacks":0,"state":{"token":"`+stateToken+`","staleAfterMs":5000}}`, types.OnPluginStartStatusOK)
	good := pushBody(now.UnixMilli(), "10.1.0.1:8000", "10.1.0.2:8000")
	cases := []struct {
		name, auth, body string
		status           int
	}{
		{"no authorization", "", good, 401},
		{"wrong scheme", "Basic " + stateToken, good, 401},
		{"wrong token", "Bearer nope", good, 401},
		{"token prefix", "Bearer " + stateToken[:5], good, 401},
		{"malformed body", "Bearer " + stateToken, `{"version":1,"hosts":[`, 400},
		{"bad address", "Bearer " + stateToken, pushBody(now.UnixMilli(), "10.1.0.1"), 400},
		{"wrong version", "Bearer " + stateToken, `{"version":9,"timestampMs":1,"hosts":[{"address":"a:1"}]}`, 400},
		{"no hosts", "Bearer " + stateToken, `{"version":1,"timestampMs":1,"hosts":[]}`, 400},
		{"empty body", "Bearer " + stateToken, "", 400},
		// A timestamp must be a whole number of milliseconds, not far
		// ahead of the gateway's clock: 1e400 once read as MaxInt64 and
		// never went stale.
		{"timestamp 1e400", "Bearer " + stateToken, pushBodyRaw("1e400", "10.1.0.1:8000"), 400},
		{"timestamp -1e400", "Bearer " + stateToken, pushBodyRaw("-1e400", "10.1.0.1:8000"), 400},
		{"fractional timestamp", "Bearer " + stateToken, pushBodyRaw(strconv.FormatInt(now.UnixMilli(), 10)+".5", "10.1.0.1:8000"), 400},
		{"timestamp past 2^53", "Bearer " + stateToken, pushBodyRaw("9007199254740993", "10.1.0.1:8000"), 400},
		{"timestamp an hour ahead", "Bearer " + stateToken, pushBody(now.Add(time.Hour).UnixMilli(), "10.1.0.1:8000"), 400},
		{"string timestamp", "Bearer " + stateToken, pushBodyRaw(`"1800000000000"`, "10.1.0.1:8000"), 400},
	}
	for _, tc := range cases {
		hs := [][2]string{}
		if tc.auth != "" {
			hs = append(hs, [2]string{"authorization", tc.auth})
		}
		id, _ := send(host, "POST", "/.kvroute/v1/state", tc.body, hs...)
		r := host.GetSentLocalResponse(id)
		if r == nil || int(r.StatusCode) != tc.status {
			t.Errorf("%s: reply %+v, want %d", tc.name, r, tc.status)
		}
		if p.stateGen != 0 || loadStateGenIn(t, host) != 0 {
			t.Fatalf("%s: a rejected push changed the state", tc.name)
		}
	}
	if got := counter(t, host, "kvroute.router.state.unauthorized"); got != 4 {
		t.Errorf("state.unauthorized = %d, want 4", got)
	}
	// Static endpoints until a good push.
	id, _ := post(host, completion)
	if d := destination(host, id); !strings.HasPrefix(d, "10.0.0.") {
		t.Fatalf("before any push destination = %q", d)
	}
	id, _ = send(host, "POST", "/.kvroute/v1/state", good, [2]string{"authorization", "bearer " + stateToken})
	if r := host.GetSentLocalResponse(id); r == nil || r.StatusCode != 200 || gjson.GetBytes(r.Data, "hosts").Int() != 2 {
		t.Fatalf("good push: reply %+v", r)
	}
	for i := 0; i < 4; i++ {
		id, _ = post(host, completion)
		if d := destination(host, id); !strings.HasPrefix(d, "10.1.0.") {
			t.Fatalf("after the push destination = %q, want a pushed host", d)
		}
	}
	if got := counter(t, host, "kvroute.router.stale_state"); got != 0 {
		t.Errorf("fresh state counted stale: %d", got)
	}
	now = now.Add(6 * time.Second)
	post(host, completion)
	if got := counter(t, host, "kvroute.router.stale_state"); got != 1 {
		t.Errorf("stale_state = %d, want 1 after the bound passed", got)
	}
	for i := range p.hosts {
		if !p.hosts[i].Stale {
			t.Errorf("host %s not marked stale", p.hosts[i].Address)
		}
	}
}

// A push older than the state in force is refused (409, counted) and
// changes nothing; the same snapshot again, or a newer one, is accepted.
func TestStatePushOlderThanInForceRefused(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	host, p := newHostWith(t, Options{Clock: func() time.Time { return now }}, RootRouter, threeEndpoints+`,"strategy":"round_robin","fallbacks":0,"state":{"token":"`+stateToken+`"}}`, types.OnPluginStartStatusOK)
	push := func(body string) int {
		t.Helper()
		id, _ := send(host, "POST", "/.kvroute/v1/state", body, [2]string{"authorization", "Bearer " + stateToken})
		r := host.GetSentLocalResponse(id)
		if r == nil {
			t.Fatal("no reply to the push")
		}
		return int(r.StatusCode)
	}
	ts := now.UnixMilli()
	if code := push(pushBody(ts, "10.1.0.1:8000")); code != 200 {
		t.Fatalf("first push: %d", code)
	}
	gen := loadStateGen(&sharedStore{emulated: true})
	if code := push(pushBody(ts-3_600_000, "10.2.0.1:8000")); code != 409 {
		t.Errorf("a push an hour older than the state in force: %d, want 409", code)
	}
	if code := push(pushBody(ts-1, "10.2.0.1:8000")); code != 409 {
		t.Errorf("a push 1 ms older than the state in force: %d, want 409", code)
	}
	if got := counter(t, host, "kvroute.router.state.rejected_older"); got != 2 {
		t.Errorf("state.rejected_older = %d, want 2", got)
	}
	if loadStateGen(&sharedStore{emulated: true}) != gen || p.stateTs != ts {
		t.Fatalf("a refused push changed the state: gen %d -> %d, timestamp %d", gen, loadStateGen(&sharedStore{emulated: true}), p.stateTs)
	}
	for i := 0; i < 3; i++ {
		id, _ := post(host, completion)
		if d := destination(host, id); d != "10.1.0.1:8000" {
			t.Fatalf("after a refused older push destination = %q, want the host in force", d)
		}
	}
	if code := push(pushBody(ts, "10.1.0.1:8000")); code != 200 {
		t.Errorf("the same snapshot again: %d, want 200", code)
	}
	if code := push(pushBody(ts+1, "10.3.0.1:8000")); code != 200 {
		t.Errorf("a newer push: %d, want 200", code)
	}
	id, _ := post(host, completion)
	if d := destination(host, id); d != "10.3.0.1:8000" {
		t.Errorf("after a newer push destination = %q", d)
	}
}

// When pushed state goes stale (the metrics service stopped pushing),
// every host is stale at once; a host last pushed unhealthy, and one whose
// breaker is open, must still stay out while others remain.
func TestStaleStateKeepsDeadHostsOut(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	host, p := newHostWith(t, Options{Clock: func() time.Time { return now }}, RootRouter, threeEndpoints+`,"strategy":"round_robin","fallbacks":0,"state":{"token":"`+stateToken+`","staleAfterMs":5000},"circuitBreaker":{"consecutiveFailures":2,"cooldownMs":600000}}`, types.OnPluginStartStatusOK)
	const sick, broken = "10.1.0.2:8000", "10.1.0.3:8000"
	body := fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[{"address":"10.1.0.1:8000"},{"address":%q,"healthy":false},{"address":%q},{"address":"10.1.0.4:8000"}]}`, now.UnixMilli(), sick, broken)
	id, _ := send(host, "POST", "/.kvroute/v1/state", body, [2]string{"authorization", "Bearer " + stateToken})
	if r := host.GetSentLocalResponse(id); r == nil || r.StatusCode != 200 {
		t.Fatalf("push: %+v", r)
	}
	respond := func(id uint32) string { return answer(host, id, broken) }
	for i := 0; i < 12; i++ { // the broken host fails twice: its breaker opens
		id, _ := post(host, completion)
		respond(id)
	}
	if got := counter(t, host, "kvroute.router.breaker.opened"); got != 1 {
		t.Fatalf("breaker.opened = %d, want 1", got)
	}
	now = now.Add(6 * time.Second) // past staleAfterMs
	got := map[string]int{}
	for i := 0; i < 30; i++ {
		id, _ := post(host, completion)
		got[respond(id)]++
	}
	if !p.hosts[0].Stale {
		t.Fatal("the pushed state is not stale")
	}
	if got[sick] != 0 || got[broken] != 0 {
		t.Errorf("with stale state the host last pushed unhealthy got %d of 30 requests and the breaker-open one %d; want 0: %v", got[sick], got[broken], got)
	}
	if got["10.1.0.1:8000"] == 0 || got["10.1.0.4:8000"] == 0 {
		t.Errorf("the healthy hosts did not share the requests: %v", got)
	}
}

// loadStateGenIn reads the state generation through the emulator's shared data.
func loadStateGenIn(t *testing.T, host proxytest.HostEmulator) uint64 {
	t.Helper()
	return loadStateGen(&sharedStore{emulated: true})
}

func TestStateEndpointDisabledWithoutToken(t *testing.T) {
	host, _ := newHost(t, RootRouter, threeEndpoints+`}`, types.OnPluginStartStatusOK)
	id, _ := send(host, "POST", "/.kvroute/v1/state", pushBody(1, "a:1"), [2]string{"authorization", "Bearer "})
	r := host.GetSentLocalResponse(id)
	if r == nil || r.StatusCode != 401 || !strings.Contains(string(r.Data), "disabled") {
		t.Errorf("reply %+v, want 401 saying the endpoint is disabled", r)
	}
}

// TestLoadCountersReturnToZero drives many requests through every ending
// (completed, reset before the response, reset mid-stream, rejected) and
// checks that every shared load counter returns to zero.
func TestLoadCountersReturnToZero(t *testing.T) {
	host, p := newHost(t, RootRouter, threeEndpoints+`}`, types.OnPluginStartStatusOK)
	rng := rand.New(rand.NewSource(1))
	var open []uint32
	for i := 0; i < 2000; i++ {
		body := fmt.Sprintf(`{"model":"m","prompt":"shared system prompt %d","max_tokens":%d}`, rng.Intn(20), 1+rng.Intn(64))
		if rng.Intn(10) == 0 {
			body = `{"model":`
		}
		id, _ := post(host, body)
		switch rng.Intn(4) {
		case 0: // reset before any response
			host.CompleteHttpContext(id)
		case 1: // response headers, then reset
			host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
			host.CompleteHttpContext(id)
		case 2: // full response
			host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
			host.CallOnResponseBody(id, []byte(`{"usage":{"prompt_tokens_details":{"cached_tokens":16}}}`), true)
			host.CompleteHttpContext(id)
		default: // still open for now
			open = append(open, id)
		}
		if len(open) > 50 {
			host.CompleteHttpContext(open[0])
			open = open[1:]
		}
	}
	loads := p.disp.Index().Loads(nil)
	busy := false
	for _, l := range loads {
		if l.InFlight != 0 {
			busy = true
		}
	}
	if !busy {
		t.Fatal("with streams open, some host must show load (the test would prove nothing)")
	}
	for _, id := range open {
		host.CompleteHttpContext(id)
	}
	for slot, l := range p.disp.Index().Loads(nil) {
		if l != (index.Load{}) {
			t.Errorf("slot %d load after every stream ended = %+v, want zero", slot, l)
		}
	}
}

func TestFeedbackFromResponses(t *testing.T) {
	host, _ := newHost(t, RootRouter, threeEndpoints+`}`, types.OnPluginStartStatusOK)
	// Non-streaming body.
	id, _ := post(host, completion)
	host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
	host.CallOnResponseBody(id, []byte(`{"id":"x","usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":48}}}`), true)
	host.CompleteHttpContext(id)
	// Stream whose final chunk carries usage, split across two chunks.
	id, _ = post(host, completion)
	host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
	host.CallOnResponseBody(id, []byte("data: {\"choices\":[{\"text\":\"hi\"}]}\n\ndata: {\"usage\":{\"prompt_tokens_details\":{\"cached_"), false)
	host.CallOnResponseBody(id, []byte("tokens\":32}}}\n\ndata: [DONE]\n\n"), true)
	host.CompleteHttpContext(id)
	if got := counter(t, host, "kvroute.router.feedback.responses"); got != 2 {
		t.Errorf("feedback.responses = %d, want 2", got)
	}
	if got := counter(t, host, "kvroute.router.confirmed_cached_tokens"); got != 80 {
		t.Errorf("confirmed_cached_tokens = %d, want 48+32", got)
	}
}

// TestOneChunkResponseReleasesOnce checks the response path of a
// non-streamed reply: its load goes back at the last body chunk, in one
// update of the shared load counters (not a first-token update and then a
// release), and its feedback counts once even though stream done follows.
func TestOneChunkResponseReleasesOnce(t *testing.T) {
	host, p := newHost(t, RootRouter, threeEndpoints+`}`, types.OnPluginStartStatusOK)
	id, _ := post(host, completion)
	busy := false
	for _, l := range p.disp.Index().Loads(nil) {
		busy = busy || l.InFlight != 0
	}
	if !busy {
		t.Fatal("no host shows the routed request's load")
	}
	host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
	writes := p.disp.Index().Metrics().Writes
	host.CallOnResponseBody(id, []byte(`{"usage":{"prompt_tokens_details":{"cached_tokens":48}}}`), true)
	if got := p.disp.Index().Metrics().Writes - writes; got != 1 {
		t.Errorf("shared-data writes for a one-chunk response = %d, want 1 (the release alone)", got)
	}
	for slot, l := range p.disp.Index().Loads(nil) {
		if l != (index.Load{}) {
			t.Errorf("slot %d load after the last body chunk = %+v, want zero", slot, l)
		}
	}
	host.CompleteHttpContext(id)
	if got := p.disp.Stats().FeedbackRequests; got != 1 {
		t.Errorf("feedback requests = %d, want 1", got)
	}
	if got := counter(t, host, "kvroute.router.confirmed_cached_tokens"); got != 48 {
		t.Errorf("confirmed_cached_tokens = %d, want 48", got)
	}
}

// TestFirstTokenOnlyForStreamedResponses checks when a response's first
// chunk ends the request's prefill in the shared load counters: for a
// streamed request it does (the engine has started decoding), while a
// non-streamed request keeps its load until the last chunk, which takes it
// all back in one update (its first byte comes only once the completion is
// done, and Envoy's HTTP/1 codec delivers a body as chunks and then an
// empty last one).
func TestFirstTokenOnlyForStreamedResponses(t *testing.T) {
	streamedBody := `{"model":"m","prompt":"You are a helpful assistant. Answer briefly.","max_tokens":16,"stream":true}`
	for _, tc := range []struct {
		name          string
		body          string
		writesAtFirst int
		prefillAfter  bool // prompt tokens still pending after the first chunk
	}{
		{"non-streamed", completion, 0, true},
		{"streamed", streamedBody, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host, p := newHost(t, RootRouter, threeEndpoints+`}`, types.OnPluginStartStatusOK)
			id, _ := post(host, tc.body)
			total := func() (l index.Load) {
				for _, x := range p.disp.Index().Loads(nil) {
					l.InFlight += x.InFlight
					l.PrefillTokens += x.PrefillTokens
					l.DecodeTokens += x.DecodeTokens
				}
				return l
			}
			if l := total(); l.InFlight != 1 || l.PrefillTokens == 0 {
				t.Fatalf("load after routing = %+v, want one request with pending prompt tokens", l)
			}
			host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
			writes := p.disp.Index().Metrics().Writes
			host.CallOnResponseBody(id, []byte(`data: {"choices":[{"text":"hi"}]}`+"\n\n"), false)
			if got := int(p.disp.Index().Metrics().Writes - writes); got != tc.writesAtFirst {
				t.Errorf("shared-data writes at the first chunk = %d, want %d", got, tc.writesAtFirst)
			}
			if l := total(); l.InFlight != 1 || (l.PrefillTokens != 0) != tc.prefillAfter {
				t.Errorf("load after the first chunk = %+v, want in flight with prompt tokens pending: %v", l, tc.prefillAfter)
			}
			writes = p.disp.Index().Metrics().Writes
			host.CallOnResponseBody(id, nil, true)
			if got := p.disp.Index().Metrics().Writes - writes; got != 1 {
				t.Errorf("shared-data writes at the last chunk = %d, want 1 (the release)", got)
			}
			if l := total(); l != (index.Load{}) {
				t.Errorf("load after the last chunk = %+v, want zero", l)
			}
			host.CompleteHttpContext(id)
		})
	}
}

// TestStreamChunksReadOnlyWhenUsageCanBeThere checks that the router reads
// a streamed response's chunks (one per token or so) only when they can
// carry the engine's usage: the request asked for it (stream_options), or
// the configuration says the engines always add it. The final chunk here
// carries usage in every case (as an engine that forces it would send), so
// whether the router read it shows in the feedback counters; the load goes
// back at the end either way.
func TestStreamChunksReadOnlyWhenUsageCanBeThere(t *testing.T) {
	const prompt = `{"model":"m","prompt":"You are a helpful assistant. Answer briefly.","max_tokens":16,"stream":true`
	const plain = `data: {"choices":[{"index":0,"delta":{"content":"token"}}]}` + "\n\n"
	const continuous = `data: {"choices":[{"index":0,"delta":{"content":"token"}}],"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":16}}}` + "\n\n"
	for _, tc := range []struct {
		name, config, body, chunk string
		read                      bool
	}{
		{"no usage asked", "", prompt + `}`, plain, false},
		{"include_usage", "", prompt + `,"stream_options":{"include_usage":true}}`, plain, true},
		{"engines always add it", `,"streamUsage":"always"`, prompt + `}`, plain, true},
		// continuous_usage_stats alone: read on only when the engine
		// honours it (its first chunk carries usage).
		{"continuous_usage_stats honoured", "", prompt + `,"stream_options":{"continuous_usage_stats":true}}`, continuous, true},
		{"continuous_usage_stats ignored", "", prompt + `,"stream_options":{"continuous_usage_stats":true}}`, plain, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host, p := newHost(t, RootRouter, threeEndpoints+tc.config+`}`, types.OnPluginStartStatusOK)
			id, _ := post(host, tc.body)
			host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
			for i := 0; i < 20; i++ {
				host.CallOnResponseBody(id, []byte(tc.chunk), false)
			}
			host.CallOnResponseBody(id, []byte(`data: {"choices":[],"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":32}}}`+"\n\ndata: [DONE]\n\n"), false)
			host.CallOnResponseBody(id, nil, true)
			host.CompleteHttpContext(id)
			want := uint64(0)
			if tc.read {
				want = 32
			}
			if got := counter(t, host, "kvroute.router.confirmed_cached_tokens"); got != want {
				t.Errorf("confirmed_cached_tokens = %d, want %d", got, want)
			}
			// The prediction error's pair: the first request predicted
			// nothing, so its error is all it confirmed.
			if got := counter(t, host, "kvroute.router.feedback.prediction_error_tokens"); got != want {
				t.Errorf("feedback.prediction_error_tokens = %d, want %d", got, want)
			}
			if got := counter(t, host, "kvroute.router.feedback.predicted_cached_tokens"); got != 0 {
				t.Errorf("feedback.predicted_cached_tokens = %d, want 0", got)
			}
			for slot, l := range p.disp.Index().Loads(nil) {
				if l != (index.Load{}) {
					t.Errorf("slot %d load after the stream = %+v, want zero", slot, l)
				}
			}
		})
	}
}

func TestCircuitBreakerOpensAndProbes(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	host, _ := newHostWith(t, Options{Clock: func() time.Time { return now }}, RootRouter, threeEndpoints+`,"strategy":"round_robin","fallbacks":0,"circuitBreaker":{"consecutiveFailures":2,"cooldownMs":1000}}`, types.OnPluginStartStatusOK)
	bad := "10.0.0.2:8000"
	respond := func(id uint32) { answer(host, id, bad) }
	sentToBad := 0
	for i := 0; i < 12; i++ {
		id, _ := post(host, completion)
		if destination(host, id) == bad {
			sentToBad++
		}
		respond(id)
	}
	if sentToBad != 2 {
		t.Errorf("requests sent to the failing host = %d, want 2 (then the breaker opens)", sentToBad)
	}
	if got := counter(t, host, "kvroute.router.breaker.opened"); got != 1 {
		t.Errorf("breaker.opened = %d, want 1", got)
	}
	// After the cool-down exactly one probe goes; it fails and re-opens.
	now = now.Add(1500 * time.Millisecond)
	probes := 0
	for i := 0; i < 9; i++ {
		id, _ := post(host, completion)
		if destination(host, id) == bad {
			probes++
		}
		respond(id)
	}
	if probes != 1 {
		t.Errorf("half-open probes = %d, want 1", probes)
	}
	if got := counter(t, host, "kvroute.router.breaker.opened"); got != 2 {
		t.Errorf("breaker.opened = %d, want 2 (the failed probe re-opens)", got)
	}
}

// A host that answers, but slower than latencyThresholdMs, counts as
// failing: two slow answers in a row open its breaker, and fast hosts keep
// theirs closed.
func TestCircuitBreakerOpensOnLatency(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	host, _ := newHostWith(t, Options{Clock: func() time.Time { return now }}, RootRouter, threeEndpoints+`,"strategy":"round_robin","fallbacks":0,"circuitBreaker":{"consecutiveFailures":2,"latencyThresholdMs":2000,"cooldownMs":60000}}`, types.OnPluginStartStatusOK)
	slow := "10.0.0.3:8000"
	sentToSlow := 0
	for i := 0; i < 12; i++ {
		id, _ := post(host, completion)
		d := destination(host, id)
		if d == slow {
			sentToSlow++
			now = now.Add(2500 * time.Millisecond) // answers after 2.5 s
		} else {
			now = now.Add(1500 * time.Millisecond) // slow too, but under the threshold
		}
		_ = host.SetProperty([]string{"upstream", "address"}, []byte(d))
		host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, true)
		host.CompleteHttpContext(id)
	}
	if sentToSlow != 2 {
		t.Errorf("requests sent to the slow host = %d, want 2 (then its breaker opens)", sentToSlow)
	}
	if got := counter(t, host, "kvroute.router.breaker.opened"); got != 1 {
		t.Errorf("breaker.opened = %d, want 1 (only the slow host's)", got)
	}
}

func TestDebugHeaderAndORCA(t *testing.T) {
	host, p := newHost(t, RootRouter, threeEndpoints+`,"debugHeader":"x-kvroute-debug","orca":true}`, types.OnPluginStartStatusOK)
	id, _ := post(host, completion)
	d := destination(host, id)
	if v, _ := header(host.GetCurrentRequestHeaders(id), "endpoint-load-metrics-format"); v != "TEXT" {
		t.Errorf("ORCA format header = %q", v)
	}
	primary := strings.Split(d, ",")[0]
	_ = host.SetProperty([]string{"upstream", "address"}, []byte(primary))
	host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}, {"endpoint-load-metrics", "TEXT named_metrics.kv_cache_usage_perc=0.75, named_metrics.num_requests_waiting=3.0"}}, false)
	dbg, _ := header(host.GetCurrentResponseHeaders(id), "x-kvroute-debug")
	if dbg == "" || !strings.Contains(dbg, primary) || strings.Contains(dbg, "helpful") {
		t.Errorf("debug header = %q: want the decision, never prompt text", dbg)
	}
	h := p.hosts[p.pos[primary]]
	if h.KVUsage != 0.75 || h.Waiting != 3 {
		t.Errorf("ORCA not applied: %+v", h)
	}
}

func TestDebugHeaderOffByDefault(t *testing.T) {
	host2, _ := newHost(t, RootRouter, threeEndpoints+`}`, types.OnPluginStartStatusOK)
	id, _ := post(host2, completion)
	host2.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
	if v, n := header(host2.GetCurrentResponseHeaders(id), "x-kvroute-debug"); n != 0 {
		t.Errorf("debug header without debugHeader: %q", v)
	}
}

func TestSharedPrefixGoesToTheSameHost(t *testing.T) {
	host, _ := newHost(t, RootRouter, threeEndpoints+`,"fallbacks":0}`, types.OnPluginStartStatusOK)
	system := strings.Repeat("You are kvroute's test assistant with a long shared system prompt. ", 40)
	first := ""
	for i := 0; i < 6; i++ {
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}],"max_tokens":8}`, system, i)
		id, _ := send(host, "POST", "/v1/chat/completions", body)
		d := destination(host, id)
		if first == "" {
			first = d
		} else if d != first {
			t.Errorf("request %d went to %s, want %s (the host holding the shared prefix)", i, d, first)
		}
		host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
		host.CallOnResponseBody(id, []byte("{}"), true)
		host.CompleteHttpContext(id)
	}
}

// A push's clearedAtMs makes the index forget that host's blocks: the
// shared prefix then has no holder, and capacity reaches the index.
func TestStatePushClearsAndSizesHosts(t *testing.T) {
	host, p := newHost(t, RootRouter, `{"fallbacks":0,"state":{"token":"`+stateToken+`","staleAfterMs":86400000}}`, types.OnPluginStartStatusOK)
	push := func(cleared int64) {
		body := fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[{"address":"10.2.0.1:8000","healthy":true,"blockSize":16,"numGpuBlocks":1000,"clearedAtMs":%d},{"address":"10.2.0.2:8000","healthy":true,"blockSize":16,"numGpuBlocks":1000,"clearedAtMs":%d}]}`, time.Now().UnixMilli(), cleared, cleared)
		id, _ := send(host, "POST", "/.kvroute/v1/state", body, [2]string{"authorization", "Bearer " + stateToken})
		if r := host.GetSentLocalResponse(id); r == nil || r.StatusCode != 200 {
			t.Fatalf("push: %+v", r)
		}
	}
	push(0)
	system := strings.Repeat("a long shared system prompt for the clear test. ", 60)
	body := chatBody(system, "q")
	matched := func() int {
		p.parser.Parse([]byte(body), openai.Chat)
		var m index.Matches
		if err := p.disp.Index().Query(p.parser.Hasher().Blocks(), &m); err != nil {
			t.Fatal(err)
		}
		_, blocks := m.Best()
		return blocks
	}
	id, _ := send(host, "POST", "/v1/chat/completions", body)
	host.CompleteHttpContext(id)
	if matched() == 0 {
		t.Fatal("the decision recorded nothing in the index")
	}
	if want := 16 * 1000 / 64; p.hosts[0].BlockCapacity != want {
		t.Errorf("BlockCapacity = %d, want %d index blocks", p.hosts[0].BlockCapacity, want)
	}
	push(time.Now().UnixMilli())
	if n := matched(); n != 0 {
		t.Errorf("after clearedAtMs the index still matches %d blocks", n)
	}
}

// Header-only mode cannot hold the headers for a body, and headers let go
// would reach an engine with the token: a push is refused from the headers.
// The token can come from the VM's environment.
func TestStatePushHeaderOnlyModeAndTokenEnv(t *testing.T) {
	t.Setenv("KVROUTE_TEST_STATE_TOKEN", stateToken)
	t.Run("header-only", func(t *testing.T) {
		host, _ := newHost(t, RootRouter, threeEndpoints+`,"bodyRouting":false,"state":{"tokenEnv":"KVROUTE_TEST_STATE_TOKEN"}}`, types.OnPluginStartStatusOK)
		id := host.InitializeHttpContext()
		host.CallOnRequestHeaders(id, [][2]string{{":method", "POST"}, {":path", "/.kvroute/v1/state"}, {"authorization", "Bearer " + stateToken}}, false)
		if r := host.GetSentLocalResponse(id); r == nil || r.StatusCode != 501 {
			t.Fatalf("header-only push: reply %+v, want 501 from the headers", r)
		}
	})
	host, p := newHost(t, RootRouter, threeEndpoints+`,"state":{"tokenEnv":"KVROUTE_TEST_STATE_TOKEN"}}`, types.OnPluginStartStatusOK)
	id := host.InitializeHttpContext()
	host.CallOnRequestHeaders(id, [][2]string{{":method", "POST"}, {":path", "/.kvroute/v1/state"}, {"authorization", "Bearer " + stateToken}}, false)
	host.CallOnRequestBody(id, []byte(pushBody(time.Now().UnixMilli(), "10.3.0.1:8000")), true)
	if r := host.GetSentLocalResponse(id); r == nil || r.StatusCode != 200 {
		t.Fatalf("push reply %+v", r)
	}
	if len(p.hosts) != 1 || p.hosts[0].Address != "10.3.0.1:8000" {
		t.Errorf("candidates after the push: %+v", p.hosts)
	}
}

// Client-supplied P/D pairing fields never reach an engine: the router
// removes them from the body it forwards (and fixes content-length).
func TestClientPDFieldsRemoved(t *testing.T) {
	host, _ := newHost(t, RootRouter, threeEndpoints+`}`, types.OnPluginStartStatusOK)
	body := `{"model":"m","kv_transfer_params":{"do_remote_prefill":true,"remote_host":"169.254.169.254","remote_port":80},` +
		`"prompt":"hello there","bootstrap_host":"169.254.169.254", "bootstrap_port":8998,"bootstrap_room":7,"max_tokens":4}`
	id, action := post(host, body, [2]string{"content-length", fmt.Sprint(len(body))})
	if action != types.ActionContinue {
		t.Fatalf("action %v", action)
	}
	got := host.GetCurrentRequestBody(id)
	if !gjson.ValidBytes(got) {
		t.Fatalf("forwarded body is not JSON: %s", got)
	}
	for _, k := range []string{"kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room", "169.254"} {
		if strings.Contains(string(got), k) {
			t.Errorf("forwarded body still has %s: %s", k, got)
		}
	}
	if gjson.GetBytes(got, "model").Str != "m" || gjson.GetBytes(got, "prompt").Str != "hello there" || gjson.GetBytes(got, "max_tokens").Int() != 4 {
		t.Errorf("other fields changed: %s", got)
	}
	if cl, _ := header(host.GetCurrentRequestHeaders(id), "content-length"); cl != fmt.Sprint(len(got)) {
		t.Errorf("content-length %s, body %d bytes", cl, len(got))
	}
	if n := counter(t, host, "kvroute.router.client_pd_fields_removed"); n != 4 {
		t.Errorf("client_pd_fields_removed = %d, want 4", n)
	}
	// A body without them is forwarded byte for byte.
	id, _ = post(host, completion)
	if got := string(host.GetCurrentRequestBody(id)); got != completion {
		t.Errorf("clean body changed: %s", got)
	}
}

// The debug header explains the decision with the router's own request state:
// a repeated prompt shows the blocks the index matched on the chosen host.
func TestDebugHeaderShowsIndexMatches(t *testing.T) {
	host, _ := newHost(t, RootRouter, threeEndpoints+`,"debugHeader":"x-kvroute-debug"}`, types.OnPluginStartStatusOK)
	long := `{"model":"m","prompt":"` + strings.Repeat("A helpful system prompt for every turn. ", 100) + `","max_tokens":16}`
	explain := func() string {
		id, _ := post(host, long)
		host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
		dbg, _ := header(host.GetCurrentResponseHeaders(id), "x-kvroute-debug")
		host.CompleteHttpContext(id)
		return dbg
	}
	first := explain()
	if !strings.Contains(first, " matched=0/") {
		t.Fatalf("first request: want nothing matched, got %q", first)
	}
	second := explain()
	i := strings.Index(second, " matched=")
	if i < 0 || strings.HasPrefix(second[i:], " matched=0/") {
		t.Fatalf("repeated prompt: want matched blocks in the explanation, got %q", second)
	}
	if strings.Contains(second, "system prompt") {
		t.Fatalf("debug header carries prompt text: %q", second)
	}
}

// TestUsageCalibratesCharsPerToken: the engine's usage.prompt_tokens,
// read from the same usage object as cached_tokens, teaches the router the
// model's characters per token: an engine counting half the tokens the
// index estimates makes the next request of that model count half.
func TestUsageCalibratesCharsPerToken(t *testing.T) {
	host, _ := newHost(t, RootRouter, threeEndpoints+`}`, types.OnPluginStartStatusOK)
	prompt := `{"model":"m","max_tokens":16,"prompt":"` + strings.Repeat("You are a helpful assistant. ", 40) + `"}`
	id, _ := post(host, prompt)
	est := counter(t, host, "kvroute.router.prompt_tokens")
	if est < 100 {
		t.Fatalf("estimated %d prompt tokens", est)
	}
	host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
	usage := fmt.Sprintf(`{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":0}}}`, est/2, est/2+1)
	host.CallOnResponseBody(id, []byte(usage), true)
	host.CompleteHttpContext(id)
	id, _ = post(host, prompt)
	second := counter(t, host, "kvroute.router.prompt_tokens") - est
	if second < est/2-2 || second > est/2+2 {
		t.Errorf("after the engine counted %d of the %d estimated tokens, the next request counts %d, want about %d", est/2, est, second, est/2)
	}
	host.CompleteHttpContext(id)
}
