package filter

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/tidwall/gjson"

	"github.com/kvroute/kvroute/filter/statnames"
	"github.com/kvroute/kvroute/openai"
)

// Native tests of kvroute.pd through the SDK's proxytest emulator. The Wasm
// tests with simulated engines are in pdwasm_test.go and pdchain_test.go
// (package filter_test).

const (
	pdDecode  = "10.0.0.11:8000"
	pdPrefill = "10.0.0.21:8000"
	pdReqID   = "3f0c7a52-0b8e-4d55-9d87-6d1f1b6a1c2e"
)

// pdClientBody is a streaming chat request with every field the vLLM
// prefill rewrite touches.
const pdClientBody = `{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"stream":true,` +
	`"stream_options":{"include_usage":true},"max_tokens":64,"max_completion_tokens":64,"min_tokens":4,"temperature":0.2}`

func pdStart(t *testing.T, pdCfg string) proxytest.HostEmulator {
	t.Helper()
	return pdStartWith(t, Options{}, pdCfg)
}

func pdStartWith(t *testing.T, opts Options, pdCfg string) proxytest.HostEmulator {
	t.Helper()
	cfg := `{"testHooks":true`
	if pdCfg != "" {
		cfg += `,"pd":` + pdCfg
	}
	cfg += `}`
	opt := proxytest.NewEmulatorOption().
		WithVMContext(NewVMContextWith("test", opts)).
		WithPluginConfiguration([]byte(cfg)).
		WithProperty([]string{"plugin_root_id"}, []byte(RootPD))
	host, reset := proxytest.NewHostEmulator(opt)
	t.Cleanup(reset)
	if got := host.StartPlugin(); got != types.OnPluginStartStatusOK {
		t.Fatalf("StartPlugin = %v; critical logs: %v", got, host.GetCriticalLogs())
	}
	return host
}

func pdHeaderValue(hs [][2]string, name string) (string, bool) {
	for _, h := range hs {
		if strings.EqualFold(h[0], name) {
			return h[1], true
		}
	}
	return "", false
}

func pdCounter(t *testing.T, host proxytest.HostEmulator, name string) uint64 {
	t.Helper()
	v, err := host.GetCounterMetric(name)
	if err != nil {
		t.Fatalf("metric %s: %v", name, err)
	}
	return v
}

// pdSend runs request headers and the whole body through the filter and
// returns the stream id and the body callback's action.
func pdSend(t *testing.T, host proxytest.HostEmulator, prefill, body string, extra ...[2]string) (uint32, types.Action) {
	t.Helper()
	id := host.InitializeHttpContext()
	hs := [][2]string{
		{":method", "POST"}, {":path", "/v1/chat/completions"}, {":authority", "gw"},
		{"x-request-id", pdReqID}, {"content-type", "application/json"},
		{"content-length", strconv.Itoa(len(body))}, {"x-gateway-destination-endpoint", pdDecode},
	}
	if prefill != "" {
		hs = append(hs, [2]string{PrefillHostHeader, prefill})
	}
	hs = append(hs, extra...)
	a := host.CallOnRequestHeaders(id, hs, false)
	if prefill != "" && a != types.ActionPause {
		t.Fatalf("request headers: %v, want Pause while the body is read", a)
	}
	if prefill == "" && a != types.ActionContinue {
		t.Fatalf("request headers without a prefill endpoint: %v, want Continue", a)
	}
	return id, host.CallOnRequestBody(id, []byte(body), true)
}

// pdMarker runs response headers and returns the marker value.
func pdMarker(t *testing.T, host proxytest.HostEmulator, id uint32, status string) (string, types.Action) {
	t.Helper()
	a := host.CallOnResponseHeaders(id, [][2]string{{":status", status}, {"content-type", "application/json"}}, false)
	v, _ := pdHeaderValue(host.GetCurrentResponseHeaders(id), "x-kvroute-pd")
	return v, a
}

func TestPDPassThroughWithoutPrefillEndpoint(t *testing.T) {
	host := pdStart(t, "")
	id, a := pdSend(t, host, "", pdClientBody)
	if a != types.ActionContinue {
		t.Fatalf("body: %v, want Continue", a)
	}
	if got := host.GetCalloutAttributesFromContext(id); len(got) != 0 {
		t.Fatalf("%d callouts for a request the router did not split", len(got))
	}
	if got := host.GetCurrentRequestBody(id); string(got) != pdClientBody {
		t.Errorf("body changed: %s", got)
	}
	if m, _ := pdMarker(t, host, id, "200"); m != "" {
		t.Errorf("marker %q on a pass-through request", m)
	}
	if n := pdCounter(t, host, "kvroute.pd.requests.passthrough"); n != 1 {
		t.Errorf("passthrough = %d, want 1", n)
	}
}

func TestPDVLLMPrefillThenDecode(t *testing.T) {
	host := pdStart(t, "")
	id, a := pdSend(t, host, pdPrefill+",10.0.0.22:8000", pdClientBody, [2]string{"accept-encoding", "gzip"}, [2]string{"authorization", "Bearer k"})
	if a != types.ActionPause {
		t.Fatalf("body: %v, want Pause until the prefill answers", a)
	}
	if _, ok := pdHeaderValue(host.GetCurrentRequestHeaders(id), PrefillHostHeader); ok {
		t.Errorf("%s still on the request: it must not reach the decode host", PrefillHostHeader)
	}
	calls := host.GetCalloutAttributesFromContext(id)
	if len(calls) != 1 {
		t.Fatalf("%d callouts, want 1", len(calls))
	}
	c := calls[0]
	if c.Upstream != "kvroute_prefill" {
		t.Errorf("callout cluster %q, want kvroute_prefill", c.Upstream)
	}
	for name, want := range map[string]string{
		"x-gateway-destination-endpoint": pdPrefill + ",10.0.0.22:8000",
		"x-request-id":                   pdReqID,
		":path":                          "/v1/chat/completions",
		":method":                        "POST",
		":authority":                     "gw",
		"content-length":                 strconv.Itoa(len(c.Body)),
	} {
		if got, _ := pdHeaderValue(c.Headers, name); got != want {
			t.Errorf("callout header %s = %q, want %q", name, got, want)
		}
	}
	if _, ok := pdHeaderValue(c.Headers, PrefillHostHeader); ok {
		t.Errorf("callout carries %s", PrefillHostHeader)
	}
	if _, ok := pdHeaderValue(c.Headers, "accept-encoding"); ok {
		t.Errorf("callout asks for a compressed answer kvroute.pd could not read")
	}
	if got, _ := pdHeaderValue(c.Headers, "authorization"); got != "Bearer k" {
		t.Errorf("callout authorization %q, want the client's", got)
	}
	pb := gjson.ParseBytes(c.Body)
	checks := map[string]string{
		"stream": "false", "max_tokens": "1", "max_completion_tokens": "1",
		"kv_transfer_params": openai.VLLMPrefillParams, "temperature": "0.2",
		"messages": `[{"role":"user","content":"hi"}]`,
	}
	for path, want := range checks {
		if got := pb.Get(path).Raw; got != want {
			t.Errorf("prefill body %s = %s, want %s", path, got, want)
		}
	}
	for _, gone := range []string{"stream_options", "min_tokens"} {
		if pb.Get(gone).Exists() {
			t.Errorf("prefill body still has %s", gone)
		}
	}

	// An answer whose kv_transfer_params has its own spacing and key order:
	// the decode request must carry exactly these bytes.
	kv := `{ "do_remote_prefill" : true,"do_remote_decode":false,"remote_block_ids":[7,8, 9],"remote_engine_id":"e-1","remote_host":"10.0.0.21","remote_port":5600,"tp_size":1 }`
	resp := `{"id":"cmpl-1","choices":[{"text":"x"}],"kv_transfer_params":` + kv + `,"usage":{"prompt_tokens":900}}`
	host.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}}, nil, []byte(resp))

	if a := host.GetCurrentHttpStreamAction(id); a != types.ActionContinue {
		t.Fatalf("after the prefill: %v, want Continue", a)
	}
	got := host.GetCurrentRequestBody(id)
	if !bytes.Contains(got, []byte(`"kv_transfer_params":`+kv)) {
		t.Fatalf("decode body lacks the prefill's kv_transfer_params byte for byte:\n%s", got)
	}
	db := gjson.ParseBytes(got)
	for path, want := range map[string]string{"stream": "true", "max_tokens": "64", "max_completion_tokens": "64",
		"min_tokens": "4", "stream_options": `{"include_usage":true}`} {
		if v := db.Get(path).Raw; v != want {
			t.Errorf("decode body %s = %s, want %s (as the client sent it)", path, v, want)
		}
	}
	if cl, _ := pdHeaderValue(host.GetCurrentRequestHeaders(id), "content-length"); cl != strconv.Itoa(len(got)) {
		t.Errorf("content-length %s, body is %d bytes", cl, len(got))
	}
	if dest, _ := pdHeaderValue(host.GetCurrentRequestHeaders(id), "x-gateway-destination-endpoint"); dest != pdDecode {
		t.Errorf("destination %q, want the decode host %q", dest, pdDecode)
	}
	if m, _ := pdMarker(t, host, id, "200"); m != "prefill=remote" {
		t.Errorf("marker %q, want prefill=remote", m)
	}
	if n := pdCounter(t, host, "kvroute.pd.requests.disaggregated"); n != 1 {
		t.Errorf("disaggregated = %d, want 1", n)
	}
	if _, err := host.GetHistogramMetric("kvroute.pd.prefill_us"); err != nil {
		t.Errorf("prefill_us histogram: %v", err)
	}
}

func TestPDVLLMClientKVTransferParamsReplaced(t *testing.T) {
	host := pdStart(t, "")
	body := `{"model":"m","prompt":"p","kv_transfer_params":{"do_remote_prefill":true,"remote_host":"169.254.169.254"}}`
	id, _ := pdSend(t, host, pdPrefill, body)
	c := host.GetCalloutAttributesFromContext(id)[0]
	if got := gjson.GetBytes(c.Body, "kv_transfer_params").Raw; got != openai.VLLMPrefillParams {
		t.Errorf("prefill kv_transfer_params %s, want ours", got)
	}
	host.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}}, nil, []byte(`{"kv_transfer_params":{"remote_host":"10.0.0.21"}}`))
	if got := gjson.GetBytes(host.GetCurrentRequestBody(id), "kv_transfer_params").Raw; got != `{"remote_host":"10.0.0.21"}` {
		t.Errorf("decode kv_transfer_params %s, want the prefill's", got)
	}
}

func TestPDVLLMFallbacks(t *testing.T) {
	cases := []struct {
		name    string
		headers [][2]string
		body    string
		reason  string
	}{
		{"prefill 500", [][2]string{{":status", "500"}}, `{"error":{"message":"boom"}}`, reasonError},
		{"prefill 503 no upstream", [][2]string{{":status", "503"}}, "no healthy upstream", reasonError},
		{"callout reset", nil, "", reasonError},
		{"envoy timeout", [][2]string{{":status", "504"}}, envoyTimeoutBody, reasonTimeout},
		{"no kv_transfer_params", [][2]string{{":status", "200"}}, `{"id":"x","choices":[]}`, reasonMalformed},
		{"null kv_transfer_params", [][2]string{{":status", "200"}}, `{"kv_transfer_params":null}`, reasonMalformed},
		{"string kv_transfer_params", [][2]string{{":status", "200"}}, `{"kv_transfer_params":"abc"}`, reasonMalformed},
		{"not JSON", [][2]string{{":status", "200"}}, `{"kv_transfer_params":{"a":1}`, reasonMalformed},
		{"nested only", [][2]string{{":status", "200"}}, `{"choices":[{"kv_transfer_params":{"a":1}}]}`, reasonMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			host := pdStart(t, "")
			id, a := pdSend(t, host, pdPrefill, pdClientBody)
			if a != types.ActionPause {
				t.Fatalf("body: %v", a)
			}
			c := host.GetCalloutAttributesFromContext(id)[0]
			host.CallOnHttpCallResponse(c.CalloutID, tc.headers, nil, []byte(tc.body))
			if a := host.GetCurrentHttpStreamAction(id); a != types.ActionContinue {
				t.Fatalf("after a failed prefill: %v, want Continue (decode-only)", a)
			}
			if got := host.GetCurrentRequestBody(id); string(got) != pdClientBody {
				t.Errorf("decode-only body is not the client's:\n%s", got)
			}
			if m, _ := pdMarker(t, host, id, "200"); m != "fallback="+tc.reason {
				t.Errorf("marker %q, want fallback=%s", m, tc.reason)
			}
			if n := pdCounter(t, host, statnames.Tagged(statnames.PD, statnames.TagReason, tc.reason, "fallbacks")); n != 1 {
				t.Errorf("fallback.%s = %d, want 1", tc.reason, n)
			}
			if n := pdCounter(t, host, "kvroute.pd.requests.disaggregated"); n != 0 {
				t.Errorf("disaggregated = %d after a fallback", n)
			}
		})
	}
}

func TestPDBadBodyGoesDecodeOnly(t *testing.T) {
	host := pdStart(t, "")
	id, a := pdSend(t, host, pdPrefill, `[1,2]`)
	if a != types.ActionContinue {
		t.Fatalf("body: %v, want Continue", a)
	}
	if n := len(host.GetCalloutAttributesFromContext(id)); n != 0 {
		t.Errorf("%d callouts for a body that is not an object", n)
	}
	if m, _ := pdMarker(t, host, id, "400"); m != "fallback=bad_body" {
		t.Errorf("marker %q", m)
	}
}

func TestPDRecoveredPanicFailsOpen(t *testing.T) {
	host := pdStart(t, "")
	id := host.InitializeHttpContext()
	a := host.CallOnRequestHeaders(id, [][2]string{{":method", "POST"}, {":path", "/v1/completions"}, {":authority", "gw"},
		{PrefillHostHeader, pdPrefill}, {"x-kvroute-test-panic", "recover"}}, false)
	if a != types.ActionContinue {
		t.Fatalf("headers after a recovered panic: %v, want Continue", a)
	}
	if a := host.CallOnRequestBody(id, []byte(pdClientBody), true); a != types.ActionContinue {
		t.Fatalf("body after a recovered panic: %v, want Continue", a)
	}
	if n := pdCounter(t, host, "kvroute.pd.recovered_panics"); n != 1 {
		t.Errorf("recovered_panics = %d", n)
	}
	if n := pdCounter(t, host, statnames.Tagged(statnames.PD, statnames.TagReason, "recovered_panic", "fallbacks")); n != 1 {
		t.Errorf("fallback.recovered_panic = %d", n)
	}
}

func TestPDSGLangBootstrap(t *testing.T) {
	host := pdStart(t, `{"protocol":"sglang"}`)
	rooms := map[string]bool{}
	for i := 0; i < 2; i++ {
		id, a := pdSend(t, host, pdPrefill+",10.0.0.22:8000", pdClientBody)
		if a != types.ActionContinue {
			t.Fatalf("body: %v, want Continue at once (SGLang pairs concurrently)", a)
		}
		calls := host.GetCalloutAttributesFromContext(id)
		if len(calls) != 1 {
			t.Fatalf("%d callouts", len(calls))
		}
		c := calls[0]
		if dest, _ := pdHeaderValue(c.Headers, "x-gateway-destination-endpoint"); dest != pdPrefill {
			t.Errorf("prefill destination %q, want only the first host %q (it is the bootstrap host)", dest, pdPrefill)
		}
		got := host.GetCurrentRequestBody(id)
		if !bytes.Equal(got, c.Body) {
			t.Errorf("decode and prefill bodies differ:\n%s\n%s", got, c.Body)
		}
		b := gjson.ParseBytes(got)
		if b.Get("bootstrap_host").String() != "10.0.0.21" || b.Get("bootstrap_port").Raw != "8998" {
			t.Errorf("bootstrap %s:%s, want 10.0.0.21:8998", b.Get("bootstrap_host").Raw, b.Get("bootstrap_port").Raw)
		}
		room := b.Get("bootstrap_room").Raw
		if n, err := strconv.ParseUint(room, 10, 64); err != nil || n >= 1<<63 {
			t.Errorf("bootstrap_room %s is not a 63-bit integer", room)
		}
		rooms[room] = true
		if b.Get("stream").Raw != "true" || b.Get("max_tokens").Raw != "64" {
			t.Errorf("client fields changed: %s", got)
		}
		if cl, _ := pdHeaderValue(host.GetCurrentRequestHeaders(id), "content-length"); cl != strconv.Itoa(len(got)) {
			t.Errorf("content-length %s, body %d", cl, len(got))
		}
		host.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}}, nil, []byte(`{"id":"x"}`))
		if m, a := pdMarker(t, host, id, "200"); m != "prefill=bootstrap" || a != types.ActionContinue {
			t.Errorf("marker %q action %v", m, a)
		}
	}
	if len(rooms) != 2 {
		t.Errorf("two requests shared a bootstrap room")
	}
	if n := pdCounter(t, host, "kvroute.pd.requests.disaggregated"); n != 2 {
		t.Errorf("disaggregated = %d, want 2", n)
	}
}

func TestPDSGLangBootstrapPortFromEndpoint(t *testing.T) {
	host := pdStart(t, `{"protocol":"sglang","bootstrapPort":0}`)
	id, _ := pdSend(t, host, "[fd00::21]:30001", pdClientBody)
	b := gjson.ParseBytes(host.GetCurrentRequestBody(id))
	if b.Get("bootstrap_host").String() != "fd00::21" || b.Get("bootstrap_port").Raw != "30001" {
		t.Errorf("bootstrap %s:%s, want fd00::21:30001", b.Get("bootstrap_host").Raw, b.Get("bootstrap_port").Raw)
	}
}

// A prefill that fails before the decode answers: the request is re-sent
// decode-only and its answer replaces the stream's.
func TestPDSGLangEarlyFailureAnswersDecodeOnly(t *testing.T) {
	host := pdStart(t, `{"protocol":"sglang"}`)
	id, _ := pdSend(t, host, pdPrefill, pdClientBody)
	c := host.GetCalloutAttributesFromContext(id)[0]
	host.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "500"}}, nil, []byte("boom"))
	calls := host.GetCalloutAttributesFromContext(id)
	if len(calls) != 2 {
		t.Fatalf("%d callouts, want the prefill and a decode-only request", len(calls))
	}
	f := calls[1]
	if f.Upstream != "kvroute_inference" || string(f.Body) != pdClientBody {
		t.Fatalf("fallback to %q with body %s, want kvroute_inference with the client's body", f.Upstream, f.Body)
	}
	if dest, _ := pdHeaderValue(f.Headers, "x-gateway-destination-endpoint"); dest != pdDecode {
		t.Errorf("fallback destination %q, want %q", dest, pdDecode)
	}
	answer := "data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\ndata: [DONE]\n\n"
	host.CallOnHttpCallResponse(f.CalloutID, [][2]string{{":status", "200"}, {"content-type", "text/event-stream"}, {"content-length", "999"}}, nil, []byte(answer))
	lr := host.GetSentLocalResponse(id)
	if lr == nil {
		t.Fatal("no response sent")
	}
	if lr.StatusCode != 200 || string(lr.Data) != answer {
		t.Errorf("local response %d %q", lr.StatusCode, lr.Data)
	}
	if m, _ := pdHeaderValue(lr.Headers, "x-kvroute-pd"); m != "fallback=prefill_error" {
		t.Errorf("marker %q", m)
	}
	if cl, _ := pdHeaderValue(lr.Headers, "content-length"); cl != strconv.Itoa(len(answer)) {
		t.Errorf("content-length %q", cl)
	}
	if n := pdCounter(t, host, "kvroute.pd.requests.late_fallback"); n != 1 {
		t.Errorf("late_fallback = %d", n)
	}
}

// A decode 5xx while the prefill is unsettled is held; the prefill then
// fails, and the decode-only answer replaces the held one.
func TestPDSGLangHeldDecodeFailureReplaced(t *testing.T) {
	host := pdStart(t, `{"protocol":"sglang"}`)
	id, _ := pdSend(t, host, pdPrefill, pdClientBody)
	c := host.GetCalloutAttributesFromContext(id)[0]
	if _, a := pdMarker(t, host, id, "503"); a != types.ActionPause {
		t.Fatalf("decode 503 with the prefill pending: %v, want Pause", a)
	}
	if a := host.CallOnResponseBody(id, []byte(`{"error":"bootstrap"}`), true); a != types.ActionPause {
		t.Fatalf("held body: %v, want Pause", a)
	}
	host.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "504"}}, nil, []byte(envoyTimeoutBody))
	f := host.GetCalloutAttributesFromContext(id)[1]
	host.CallOnHttpCallResponse(f.CalloutID, [][2]string{{":status", "200"}, {"content-type", "application/json"}}, nil, []byte(`{"ok":true}`))
	if a := host.GetCurrentHttpStreamAction(id); a != types.ActionContinue {
		t.Fatalf("after the fallback: %v, want Continue", a)
	}
	hs := host.GetCurrentResponseHeaders(id)
	if st, _ := pdHeaderValue(hs, ":status"); st != "200" {
		t.Errorf("status %q, want the decode-only 200", st)
	}
	if m, _ := pdHeaderValue(hs, "x-kvroute-pd"); m != "fallback=prefill_timeout" {
		t.Errorf("marker %q", m)
	}
	if got := host.GetCurrentResponseBody(id); string(got) != `{"ok":true}` {
		t.Errorf("body %q", got)
	}
}

// A decode 5xx while the prefill is pending, and the prefill then succeeds:
// the decode's own error goes through.
func TestPDSGLangDecodeFailureNotPrefills(t *testing.T) {
	host := pdStart(t, `{"protocol":"sglang"}`)
	id, _ := pdSend(t, host, pdPrefill, pdClientBody)
	c := host.GetCalloutAttributesFromContext(id)[0]
	if _, a := pdMarker(t, host, id, "500"); a != types.ActionPause {
		t.Fatalf("decode 500: %v, want Pause", a)
	}
	host.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}}, nil, []byte(`{}`))
	if a := host.GetCurrentHttpStreamAction(id); a != types.ActionContinue {
		t.Fatalf("after the prefill succeeded: %v, want Continue", a)
	}
	if n := len(host.GetCalloutAttributesFromContext(id)); n != 1 {
		t.Errorf("%d callouts: a decode failure must not trigger the prefill fallback", n)
	}
	if m, _ := pdHeaderValue(host.GetCurrentResponseHeaders(id), "x-kvroute-pd"); m != "prefill=bootstrap" {
		t.Errorf("marker %q", m)
	}
}

func TestPDBodyHelpers(t *testing.T) {
	for _, bad := range []string{`"str"`, `[{}]`, `{"a":}`, ``, ` `, `{"a":1}x`} {
		if _, ok := openai.ParseObject([]byte(bad)); ok {
			t.Errorf("openai.ParseObject accepted %q", bad)
		}
	}
	// Without max_completion_tokens none is added; max_tokens always is.
	ms, _ := openai.ParseObject([]byte(`{"prompt":"p"}`))
	pb := openai.VLLMPrefillBody(ms)
	if gjson.GetBytes(pb, "max_completion_tokens").Exists() || gjson.GetBytes(pb, "max_tokens").Raw != "1" {
		t.Errorf("prefill body %s", pb)
	}
	// An escaped key is the key it decodes to: a client cannot keep its own
	// "stream" by spelling it differently.
	ms, _ = openai.ParseObject([]byte(`{"str\u0065am":true, "kv_transfer_params" : {"a" : 1} ,"n":[1,{"}":"]"}]}`))
	pb = openai.VLLMPrefillBody(ms)
	if got := gjson.GetBytes(pb, "stream").Raw; got != "false" || strings.Contains(string(pb), `u0065`) {
		t.Errorf("escaped stream kept: %s", pb)
	}
	if got := gjson.GetBytes(pb, "n").Raw; got != `[1,{"}":"]"}]` {
		t.Errorf("nested member changed: %s", got)
	}
	kv, ok := openai.KVTransferParams([]byte(`{"kv_transfer_params" :  {"x":[1, 2]} , "z":0}`))
	if !ok || string(kv) != `{"x":[1, 2]}` {
		t.Errorf("openai.KVTransferParams = %q, %v", kv, ok)
	}
	if _, ok := openai.KVTransferParams([]byte(`{"kv_transfer_params":[1]}`)); ok {
		t.Error("an array accepted as kv_transfer_params")
	}
	for _, tc := range []struct {
		in   string
		host string
		port int
		ok   bool
	}{
		{"10.0.0.1:8000", "10.0.0.1", 8000, true},
		{"[fd00::1]:9", "fd00::1", 9, true},
		{"pod.ns.svc:30000", "pod.ns.svc", 30000, true},
		{"10.0.0.1", "", 0, false},
		{":8000", "", 0, false},
		{"h:0", "", 0, false},
		{"h:x", "", 0, false},
	} {
		h, p, ok := openai.SplitAddress(tc.in)
		if h != tc.host || p != tc.port || ok != tc.ok {
			t.Errorf("openai.SplitAddress(%q) = %q, %d, %v", tc.in, h, p, ok)
		}
	}
}

// Without allow_on_headers_stop_iteration Envoy never delivers the body to a
// filter holding the headers: the tick sends such a request on decode-only.
// The test steps the plugin's clock (Options.Clock), so the wait is exact
// however long the machine takes between two calls.
func TestPDNoBodySendsDecodeOnly(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	host := pdStartWith(t, Options{PDBodyWait: 20 * time.Millisecond, Clock: func() time.Time { return now }}, "")
	if p := host.GetTickPeriod(); p != pdTickMs {
		t.Fatalf("tick period %d, want %d", p, pdTickMs)
	}
	id := host.InitializeHttpContext()
	a := host.CallOnRequestHeaders(id, [][2]string{{":method", "POST"}, {":path", "/v1/completions"}, {":authority", "gw"},
		{PrefillHostHeader, pdPrefill}}, false)
	if a != types.ActionPause {
		t.Fatalf("headers: %v", a)
	}
	host.Tick()
	if a := host.GetCurrentHttpStreamAction(id); a != types.ActionPause {
		t.Fatalf("resumed before the wait was over: %v", a)
	}
	now = now.Add(19 * time.Millisecond)
	host.Tick()
	if a := host.GetCurrentHttpStreamAction(id); a != types.ActionPause {
		t.Fatalf("resumed 19 ms into a 20 ms wait: %v", a)
	}
	now = now.Add(time.Millisecond)
	host.Tick()
	if a := host.GetCurrentHttpStreamAction(id); a != types.ActionContinue {
		t.Fatalf("after the wait: %v, want Continue (decode-only)", a)
	}
	if n := pdCounter(t, host, statnames.Tagged(statnames.PD, statnames.TagReason, "no_body", "fallbacks")); n != 1 {
		t.Errorf("fallback.no_body = %d", n)
	}
	if logs := strings.Join(host.GetErrorLogs(), "\n"); !strings.Contains(logs, "allow_on_headers_stop_iteration") {
		t.Errorf("no log telling the operator what to set: %q", logs)
	}
	// The held body then passes untouched, with no prefill.
	if a := host.CallOnRequestBody(id, []byte(pdClientBody), true); a != types.ActionContinue {
		t.Errorf("body after the resume: %v", a)
	}
	if n := len(host.GetCalloutAttributesFromContext(id)); n != 0 {
		t.Errorf("%d callouts after a decode-only resume", n)
	}
	if m, _ := pdMarker(t, host, id, "200"); m != "fallback=no_body" {
		t.Errorf("marker %q", m)
	}
	// A request whose body arrives in time is not touched by the tick.
	id2, a2 := pdSend(t, host, pdPrefill, pdClientBody)
	now = now.Add(30 * time.Millisecond)
	host.Tick()
	if a2 != types.ActionPause || host.GetCurrentHttpStreamAction(id2) != types.ActionPause {
		t.Errorf("a request waiting for its prefill was resumed by the tick")
	}
}

// Only token-generating endpoints are split; the router's header never
// reaches an upstream either way.
func TestPDSplitsOnlyGeneratingPaths(t *testing.T) {
	host := pdStart(t, "")
	for path, split := range map[string]bool{
		"/v1/embeddings": false, "/v1/models": false, "/v1/completions?x=1": true, "/v1/chat/completions": true,
	} {
		id := host.InitializeHttpContext()
		a := host.CallOnRequestHeaders(id, [][2]string{{":method", "POST"}, {":path", path}, {":authority", "gw"},
			{PrefillHostHeader, pdPrefill}}, false)
		if split != (a == types.ActionPause) {
			t.Errorf("%s: action %v, split %v", path, a, split)
		}
		if _, ok := pdHeaderValue(host.GetCurrentRequestHeaders(id), PrefillHostHeader); ok {
			t.Errorf("%s: %s left on the request", path, PrefillHostHeader)
		}
	}
}

// Data-parallel ranks on both hops: the router names the prefill rank in
// PrefillHostHeader (host:port|rank/size) and the decode rank in
// x-data-parallel-rank. The prefill callout goes to the endpoint alone with
// the prefill's rank; the decode request keeps the decode's; a prefill host
// without ranks gets no rank header (never the decode's). SGLang's room
// names the prefill rank (room % size), as its prefill and decode both read
// it.
func TestPDRanksOnBothHops(t *testing.T) {
	for _, proto := range []string{"vllm", "sglang"} {
		t.Run(proto, func(t *testing.T) {
			host := pdStart(t, `{"protocol":"`+proto+`"}`)
			for _, c := range []struct {
				prefill, wantRank string
			}{
				{pdPrefill + "|2/4,10.0.0.22:8000|0/2", "2"},
				{pdPrefill, ""},
			} {
				id, _ := pdSend(t, host, c.prefill, pdClientBody, [2]string{DataParallelRankHeader, "1"})
				calls := host.GetCalloutAttributesFromContext(id)
				if len(calls) != 1 {
					t.Fatalf("%s: %d callouts, want 1", c.prefill, len(calls))
				}
				dest, _ := pdHeaderValue(calls[0].Headers, "x-gateway-destination-endpoint")
				if !strings.HasPrefix(dest, pdPrefill) || strings.Contains(dest, "|") {
					t.Errorf("%s: prefill destination %q, want the endpoint(s) without ranks", c.prefill, dest)
				}
				rank, ok := pdHeaderValue(calls[0].Headers, DataParallelRankHeader)
				if rank != c.wantRank || ok != (c.wantRank != "") {
					t.Errorf("%s: prefill callout rank header %q (present %v), want %q", c.prefill, rank, ok, c.wantRank)
				}
				if got, _ := pdHeaderValue(host.GetCurrentRequestHeaders(id), DataParallelRankHeader); got != "1" {
					t.Errorf("%s: decode request rank %q, want the router's 1", c.prefill, got)
				}
				if proto == "sglang" {
					b := gjson.ParseBytes(calls[0].Body)
					room := b.Get("bootstrap_room").Uint()
					if c.wantRank != "" && room%4 != 2 {
						t.Errorf("bootstrap_room %d %% 4 = %d, want the prefill rank 2", room, room%4)
					}
					if b.Get("bootstrap_host").String() != "10.0.0.21" || room >= 1<<63 {
						t.Errorf("bootstrap host %s room %d", b.Get("bootstrap_host").Raw, room)
					}
					host.CallOnHttpCallResponse(calls[0].CalloutID, [][2]string{{":status", "200"}}, nil, []byte(`{"id":"x"}`))
				} else {
					kv := `{"do_remote_prefill":true,"remote_engine_id":"e-2"}`
					host.CallOnHttpCallResponse(calls[0].CalloutID, [][2]string{{":status", "200"}}, nil, []byte(`{"kv_transfer_params":`+kv+`}`))
					if m, _ := pdMarker(t, host, id, "200"); m != "prefill=remote" {
						t.Errorf("%s: marker %q, want prefill=remote", c.prefill, m)
					}
				}
			}
		})
	}
}
