package filter_test

// The Wasm integration tests of the kvroute.pd filter: dist/kvroute.wasm
// loaded in internal/sim/wasmhost (Envoy's behaviour, with
// allow_on_headers_stop_iteration) in front of simulated prefill and decode
// engines from internal/sim/server, over real HTTP on loopback.
//
// Every engine sits behind a recording reverse proxy, so a test can compare
// what the prefill host answered with what the decode host then received,
// byte for byte.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/filter/statnames"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/server"
	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/wasmhosttest"
)

const (
	decodeCluster  = "kvroute_inference"
	prefillCluster = "kvroute_prefill"
	destHeader     = "x-gateway-destination-endpoint"
	markerHeader   = "X-Kvroute-Pd"
	requestID      = "8d1e7c1e-6a3b-4bb0-9a57-3c0c8e4f2d11"
)

// --- recording proxies -----------------------------------------------------

// exchange is one request a recorder saw and what was answered.
type exchange struct {
	path     string
	header   http.Header
	body     []byte
	status   int
	respBody []byte
}

// recorder is an HTTP server in front of one engine (or a fake) that keeps
// every exchange.
type recorder struct {
	addr     string
	mu       sync.Mutex
	ex       []exchange
	inflight atomic.Int64
}

// exchanges returns what the recorder saw, once the exchanges under way
// are over (a client can read a whole response before its handler returns).
func (r *recorder) exchanges() []exchange {
	testenv.Poll(5*time.Second, func() bool { return r.inflight.Load() == 0 })
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]exchange(nil), r.ex...)
}

// inference returns the exchanges on OpenAI paths (not bootstrap polls).
func (r *recorder) inference() []exchange {
	var out []exchange
	for _, e := range r.exchanges() {
		if strings.HasPrefix(e.path, "/v1/") {
			out = append(out, e)
		}
	}
	return out
}

type teeWriter struct {
	http.ResponseWriter
	status int
	buf    bytes.Buffer
}

func (w *teeWriter) WriteHeader(code int) { w.status = code; w.ResponseWriter.WriteHeader(code) }
func (w *teeWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = 200
	}
	w.buf.Write(b)
	return w.ResponseWriter.Write(b)
}
func (w *teeWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func newRecorder(t *testing.T, h http.Handler) *recorder {
	t.Helper()
	rec := &recorder{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.inflight.Add(1)
		defer rec.inflight.Add(-1)
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		tw := &teeWriter{ResponseWriter: w}
		h.ServeHTTP(tw, r)
		rec.mu.Lock()
		rec.ex = append(rec.ex, exchange{path: r.URL.Path, header: r.Header.Clone(), body: body, status: tw.status, respBody: tw.buf.Bytes()})
		rec.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	rec.addr = strings.TrimPrefix(srv.URL, "http://")
	return rec
}

// proxyTo records in front of a simulated engine.
func proxyTo(t *testing.T, addr string) *recorder {
	u, _ := url.Parse("http://" + addr)
	p := httputil.NewSingleHostReverseProxy(u)
	p.FlushInterval = -1
	return newRecorder(t, p)
}

// --- the setup ---------------------------------------------------------------

type setup struct {
	host    *wasmhost.Host
	url     string
	prefill *recorder
	decode  *recorder
	engines *server.Fleet // [0] prefill, [1] decode (when simulated)
}

// engines starts one simulated prefill and one decode engine.
func engines(t *testing.T, scale float64) *server.Fleet {
	t.Helper()
	f, err := server.Start(server.Options{Replicas: 2, Roles: []string{"prefill", "decode"}, TimeScale: scale, TimeScaleSet: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// start runs kvroute.pd alone in the wasm host, with allow_on_headers_stop_iteration,
// in front of the decode recorder (route cluster) and the prefill recorder
// (prefill cluster). kvroute.router is not in the chain: the client sets the
// prefill endpoint header itself, standing in for the router.
func start(t *testing.T, pdConfig string, prefill, decode *recorder) *setup {
	t.Helper()
	return startAllow(t, pdConfig, prefill, decode, true)
}

func startAllow(t *testing.T, pdConfig string, prefill, decode *recorder, allowStopIteration bool) *setup {
	t.Helper()
	cfg := `{}`
	if pdConfig != "" {
		cfg = `{"pd":` + pdConfig + `}`
	}
	h, url := wasmhosttest.Start(t, wasmhost.Config{
		Module:       testenv.Module(t),
		VMID:         "kvroute",
		Workers:      1,
		Filters:      []wasmhost.Filter{{RootID: filter.RootPD, Configuration: cfg, AllowOnHeadersStopIteration: allowStopIteration}},
		Clusters:     map[string][]string{decodeCluster: {decode.addr}, prefillCluster: {prefill.addr}},
		RouteCluster: decodeCluster,
		RouteTimeout: 30 * time.Second,
	})
	return &setup{host: h, url: url, prefill: prefill, decode: decode}
}

// simulated wires a fresh prefill/decode engine pair behind recorders.
func simulated(t *testing.T, pdConfig string, scale float64) *setup {
	f := engines(t, scale)
	s := start(t, pdConfig, proxyTo(t, f.Servers[0].Addr), proxyTo(t, f.Servers[1].Addr))
	s.engines = f
	return s
}

// --- the client ----------------------------------------------------------------

type reply struct {
	status int
	header http.Header
	body   []byte
	ttft   time.Duration // first body byte
}

// send posts body with the routing headers kvroute.router would have set:
// the decode host in the destination header, the prefill host in
// filter.PrefillHostHeader.
func (s *setup) send(t *testing.T, path, body string) reply {
	t.Helper()
	return s.sendRaw(t, path, body, map[string]string{destHeader: s.decode.addr, filter.PrefillHostHeader: s.prefill.addr})
}

func (s *setup) sendRaw(t *testing.T, path, body string, hdr map[string]string) reply {
	t.Helper()
	req, _ := http.NewRequest("POST", s.url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", requestID)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	client := &http.Client{Timeout: 30 * time.Second}
	t0 := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var ttft time.Duration
	if _, err := br.Peek(1); err == nil {
		ttft = time.Since(t0)
	}
	b, _ := io.ReadAll(br)
	return reply{status: resp.StatusCode, header: resp.Header, body: b, ttft: ttft}
}

// prompt is n simulator tokens of text.
func prompt(n int, salt string) string {
	var b strings.Builder
	for b.Len() < n*sim.CharsPerToken {
		fmt.Fprintf(&b, "%s the quick brown fox %d. ", salt, b.Len())
	}
	return b.String()[:n*sim.CharsPerToken]
}

func completion(tokens, maxTokens int, stream bool, salt string) string {
	s := fmt.Sprintf(`{"model":"llama-3-8b","prompt":%q,"max_tokens":%d,"temperature":0`, prompt(tokens, salt), maxTokens)
	if stream {
		s += `,"stream":true,"stream_options":{"include_usage":true}`
	}
	return s + `}`
}

// sse checks an event stream and returns its JSON events (without [DONE]).
func sse(t *testing.T, body []byte) []gjson.Result {
	t.Helper()
	var events []gjson.Result
	done := false
	for _, block := range strings.Split(strings.TrimSpace(string(body)), "\n\n") {
		data, ok := strings.CutPrefix(block, "data: ")
		if !ok {
			t.Fatalf("not an SSE data block: %q", block)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		if done {
			t.Fatalf("event after [DONE]: %q", data)
		}
		if !gjson.Valid(data) {
			t.Fatalf("event is not JSON: %q", data)
		}
		events = append(events, gjson.Parse(data))
	}
	if !done {
		t.Fatalf("stream did not end with [DONE]")
	}
	return events
}

func counter(h *wasmhost.Host, name string) int64 { return h.CounterValue(name) }

// --- vLLM -----------------------------------------------------------------------

// checkTransfer asserts the decode request carries the prefill answer's
// kv_transfer_params byte for byte, and returns it.
func checkTransfer(t *testing.T, s *setup) string {
	t.Helper()
	pre := s.prefill.inference()
	dec := s.decode.inference()
	if len(pre) != 1 || len(dec) != 1 {
		t.Fatalf("%d prefill and %d decode requests, want 1 and 1", len(pre), len(dec))
	}
	kvOut := gjson.GetBytes(pre[0].respBody, "kv_transfer_params")
	if !kvOut.IsObject() || !kvOut.Get("do_remote_prefill").Bool() || kvOut.Get("remote_engine_id").String() == "" {
		t.Fatalf("prefill answered without usable kv_transfer_params: %s", pre[0].respBody)
	}
	kvIn := gjson.GetBytes(dec[0].body, "kv_transfer_params")
	if kvIn.Raw != kvOut.Raw {
		t.Fatalf("decode got kv_transfer_params\n%s\nprefill returned\n%s", kvIn.Raw, kvOut.Raw)
	}
	for _, e := range []exchange{pre[0], dec[0]} {
		if got := e.header.Get("X-Request-Id"); got != requestID {
			t.Errorf("%s got x-request-id %q, want the client's %q", e.path, got, requestID)
		}
		if e.header.Get(filter.PrefillHostHeader) != "" {
			t.Errorf("%s received %s", e.path, filter.PrefillHostHeader)
		}
	}
	pb := gjson.ParseBytes(pre[0].body)
	if pb.Get("stream").Raw != "false" || pb.Get("max_tokens").Raw != "1" || pb.Get("stream_options").Exists() ||
		!pb.Get("kv_transfer_params.do_remote_decode").Bool() {
		t.Errorf("prefill request is not prefill-only: stream=%s max_tokens=%s stream_options=%s kv=%s",
			pb.Get("stream").Raw, pb.Get("max_tokens").Raw, pb.Get("stream_options").Raw, pb.Get("kv_transfer_params").Raw)
	}
	return kvOut.Raw
}

func TestVLLMStreamingDecodeGetsPrefillKV(t *testing.T) {
	s := simulated(t, "", 0.2)
	const promptTokens, maxTokens = 2048, 12
	body := completion(promptTokens, maxTokens, true, "stream")
	r := s.send(t, "/v1/completions", body)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if m := r.header.Get(markerHeader); m != "prefill=remote" {
		t.Errorf("marker %q, want prefill=remote", m)
	}
	checkTransfer(t, s)
	dec := s.decode.inference()[0]
	db := gjson.ParseBytes(dec.body)
	if db.Get("stream").Raw != "true" || db.Get("max_tokens").Int() != maxTokens || db.Get("stream_options.include_usage").Raw != "true" {
		t.Errorf("decode request lost the client's streaming fields: stream=%s max_tokens=%s stream_options=%s",
			db.Get("stream").Raw, db.Get("max_tokens").Raw, db.Get("stream_options").Raw)
	}
	// The client's stream is the decode's, intact.
	if !bytes.Equal(r.body, dec.respBody) {
		t.Errorf("client stream differs from the decode host's (%d vs %d bytes)", len(r.body), len(dec.respBody))
	}
	events := sse(t, r.body)
	var text int
	var usage gjson.Result
	for _, e := range events {
		if c := e.Get("choices.0"); c.Exists() {
			text++
		}
		if u := e.Get("usage"); u.IsObject() {
			usage = u
		}
	}
	if text != maxTokens {
		t.Errorf("%d token events, want %d", text, maxTokens)
	}
	if usage.Get("completion_tokens").Int() != maxTokens || usage.Get("prompt_tokens").Int() != promptTokens {
		t.Errorf("usage %s", usage.Raw)
	}
	// The decode engine received the prompt's KV: all but the last token
	// count as cached, and it computed a single prompt token.
	if got := usage.Get("prompt_tokens_details.cached_tokens").Int(); got != promptTokens-1 {
		t.Errorf("decode cached_tokens %d, want %d (KV transferred)", got, promptTokens-1)
	}
	if got := s.engines.Servers[1].Stats().PromptTokens; got != 1 {
		t.Errorf("decode engine computed %d prompt tokens, want 1", got)
	}
	if got := s.engines.Servers[0].Stats().PromptTokens; got != promptTokens {
		t.Errorf("prefill engine computed %d prompt tokens, want %d", got, promptTokens)
	}
	if got := counter(s.host, "kvroute.pd.requests.disaggregated"); got != 1 {
		t.Errorf("disaggregated = %d", got)
	}
}

func TestVLLMNonStreamingChat(t *testing.T) {
	s := simulated(t, "", 0.1)
	body := fmt.Sprintf(`{"model":"llama-3-8b","messages":[{"role":"system","content":%q},{"role":"user","content":"go"}],"max_completion_tokens":5}`,
		prompt(1500, "chat"))
	r := s.send(t, "/v1/chat/completions", body)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if m := r.header.Get(markerHeader); m != "prefill=remote" {
		t.Errorf("marker %q", m)
	}
	checkTransfer(t, s)
	pre := gjson.ParseBytes(s.prefill.inference()[0].body)
	if pre.Get("max_completion_tokens").Raw != "1" {
		t.Errorf("prefill max_completion_tokens %s, want 1", pre.Get("max_completion_tokens").Raw)
	}
	dec := s.decode.inference()[0]
	if gjson.GetBytes(dec.body, "max_completion_tokens").Raw != "5" {
		t.Errorf("decode max_completion_tokens %s, want the client's 5", gjson.GetBytes(dec.body, "max_completion_tokens").Raw)
	}
	if !bytes.Equal(r.body, dec.respBody) {
		t.Errorf("client body differs from the decode host's")
	}
	resp := gjson.ParseBytes(r.body)
	if resp.Get("object").String() != "chat.completion" || resp.Get("usage.completion_tokens").Int() != 5 {
		t.Errorf("response %s", r.body)
	}
}

// TTFT of a disaggregated request includes the remote prefill and the KV
// transfer, and the decode host does not prefill.
func TestVLLMTTFTReflectsTransferredPrefill(t *testing.T) {
	const scale = 1.0
	s := simulated(t, "", scale)
	prof := s.engines.Servers[0].Profile()
	const n = 8192
	r := s.send(t, "/v1/completions", completion(n, 4, true, "ttft"))
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	prefill := prof.PrefillTime(0, n)
	transfer := time.Duration(float64(n) * prof.KVBytesPerToken() / 50e9 * float64(time.Second))
	floor := time.Duration(float64(prefill+transfer) * scale)
	t.Logf("TTFT %v; prefill %v + KV transfer %v (scale %g)", r.ttft, prefill, transfer, scale)
	if r.ttft < floor {
		t.Errorf("TTFT %v is below the remote prefill plus transfer %v", r.ttft, floor)
	}
	if r.ttft > floor+2*time.Second {
		t.Errorf("TTFT %v: far above the remote prefill plus transfer %v", r.ttft, floor)
	}
	if got := s.engines.Servers[1].Stats().PromptTokens; got != 1 {
		t.Errorf("decode engine prefilled %d tokens, want 1", got)
	}
	if got := s.engines.Servers[0].Stats().PromptTokens; got != n {
		t.Errorf("prefill engine prefilled %d tokens, want %d", got, n)
	}
	// The filter's prefill histogram saw the remote prefill, and it is
	// within the client's TTFT.
	m, ok := s.host.Metric("kvroute.pd.prefill_us")
	if !ok || len(m.Samples) != 1 {
		t.Fatalf("kvroute.pd.prefill_us: %+v", m)
	}
	if us := time.Duration(m.Samples[0]) * time.Microsecond; us < time.Duration(float64(prefill)*scale) || us > r.ttft {
		t.Errorf("prefill_us %v, want between the prefill %v and the TTFT %v", us, prefill, r.ttft)
	}
}

// --- failures (vLLM) ----------------------------------------------------------

// fakePrefill answers every request with h.
func fakePrefill(t *testing.T, h http.HandlerFunc) *recorder { return newRecorder(t, h) }

func TestVLLMPrefillFailuresFallBackToDecode(t *testing.T) {
	cases := []struct {
		name, pd, reason string
		prefill          func(t *testing.T) *recorder
	}{
		{"prefill 500", "", "prefill_error", func(t *testing.T) *recorder {
			return fakePrefill(t, func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, `{"error":{"message":"engine dead"}}`, 500)
			})
		}},
		{"prefill unreachable", "", "prefill_error", func(t *testing.T) *recorder {
			return &recorder{addr: refusedAddr(t)}
		}},
		{"prefill timeout", `{"timeoutMs":150}`, "prefill_timeout", func(t *testing.T) *recorder {
			return fakePrefill(t, func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-time.After(3 * time.Second):
				case <-r.Context().Done():
				}
			})
		}},
		{"prefill without kv_transfer_params", "", "prefill_malformed", func(t *testing.T) *recorder {
			return fakePrefill(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"id":"cmpl-1","choices":[{"text":"x"}],"usage":{"prompt_tokens":3}}`)
			})
		}},
		{"prefill garbage", "", "prefill_malformed", func(t *testing.T) *recorder {
			return fakePrefill(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "<html>oops") })
		}},
		{"unknown prefill cluster", `{"prefillCluster":"no_such_cluster"}`, "dispatch_failed", func(t *testing.T) *recorder {
			return &recorder{addr: refusedAddr(t)}
		}},
	}
	for _, stream := range []bool{false, true} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/stream=%v", tc.name, stream), func(t *testing.T) {
				f := engines(t, 0.05)
				s := start(t, tc.pd, tc.prefill(t), proxyTo(t, f.Servers[1].Addr))
				const n = 600
				body := completion(n, 3, stream, tc.name)
				r := s.send(t, "/v1/completions", body)
				if r.status != 200 {
					t.Fatalf("client got %d (%s): a failed prefill must never cost the request", r.status, r.body)
				}
				if m := r.header.Get(markerHeader); m != "fallback="+tc.reason {
					t.Errorf("marker %q, want fallback=%s", m, tc.reason)
				}
				if got := counter(s.host, statnames.Tagged(statnames.PD, statnames.TagReason, tc.reason, "fallbacks")); got != 1 {
					t.Errorf("kvroute.pd.fallbacks{kvroute_reason=%s} = %d, want 1", tc.reason, got)
				}
				if got := counter(s.host, "kvroute.pd.requests.disaggregated"); got != 0 {
					t.Errorf("disaggregated = %d", got)
				}
				dec := s.decode.inference()
				if len(dec) != 1 || string(dec[0].body) != body {
					t.Fatalf("decode host did not get the client's body unchanged")
				}
				// Decode-only: the decode engine prefilled the whole prompt.
				if got := f.Servers[1].Stats().PromptTokens; got != n {
					t.Errorf("decode engine prefilled %d tokens, want %d", got, n)
				}
				if stream {
					sse(t, r.body)
				} else if !gjson.ValidBytes(r.body) {
					t.Errorf("body is not JSON: %s", r.body)
				}
			})
		}
	}
}

// --- SGLang ---------------------------------------------------------------------

func TestSGLangBootstrapPair(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			// The simulator serves the bootstrap on the prefill server's own
			// port (bootstrapPort 0).
			s := simulated(t, `{"protocol":"sglang","bootstrapPort":0}`, 0.1)
			const n, maxTokens = 3000, 6
			r := s.send(t, "/v1/completions", completion(n, maxTokens, stream, "sgl"))
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if m := r.header.Get(markerHeader); m != "prefill=bootstrap" {
				t.Errorf("marker %q", m)
			}
			pre, dec := s.prefill.inference(), s.decode.inference()
			if len(pre) != 1 || len(dec) != 1 {
				t.Fatalf("%d prefill, %d decode requests", len(pre), len(dec))
			}
			if !bytes.Equal(pre[0].body, dec[0].body) {
				t.Errorf("prefill and decode bodies differ")
			}
			b := gjson.ParseBytes(dec[0].body)
			host, port, _ := net.SplitHostPort(s.prefill.addr)
			if b.Get("bootstrap_host").String() != host || b.Get("bootstrap_port").String() != port || !b.Get("bootstrap_room").Exists() {
				t.Errorf("bootstrap %s:%s room %s, want %s", b.Get("bootstrap_host"), b.Get("bootstrap_port"), b.Get("bootstrap_room").Raw, s.prefill.addr)
			}
			if dec[0].header.Get("X-Request-Id") != requestID || pre[0].header.Get("X-Request-Id") != requestID {
				t.Errorf("x-request-id not carried to both")
			}
			if !bytes.Equal(r.body, dec[0].respBody) {
				t.Errorf("client body differs from the decode host's")
			}
			if stream {
				sse(t, r.body)
			}
			if got := s.engines.Servers[1].Stats().PromptTokens; got != 1 {
				t.Errorf("decode engine prefilled %d tokens, want 1 (KV from the prefill peer)", got)
			}
			if got := s.engines.Servers[0].Stats().PromptTokens; got != n {
				t.Errorf("prefill engine prefilled %d tokens, want %d", got, n)
			}
			// The prefill callout's success is counted when it lands.
			testenv.Poll(3*time.Second, func() bool { return counter(s.host, "kvroute.pd.requests.disaggregated") == 1 })
			if got := counter(s.host, "kvroute.pd.requests.disaggregated"); got != 1 {
				t.Errorf("disaggregated = %d", got)
			}
		})
	}
}

func TestSGLangPrefillFailureFallsBackToDecode(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			f := engines(t, 0.05)
			// The prefill answers 500, and so does its bootstrap endpoint:
			// the decode engine, waiting for the room, fails with 503.
			bad := fakePrefill(t, func(w http.ResponseWriter, r *http.Request) {
				time.Sleep(20 * time.Millisecond)
				http.Error(w, "prefill engine crashed", 500)
			})
			s := start(t, `{"protocol":"sglang","bootstrapPort":0}`, bad, proxyTo(t, f.Servers[1].Addr))
			const n = 800
			body := completion(n, 4, stream, "sglfail")
			r := s.send(t, "/v1/completions", body)
			if r.status != 200 {
				t.Fatalf("client got %d (%s): a failed prefill must never cost the request", r.status, r.body)
			}
			if m := r.header.Get(markerHeader); m != "fallback=prefill_error" {
				t.Errorf("marker %q, want fallback=prefill_error", m)
			}
			if got := counter(s.host, statnames.Tagged(statnames.PD, statnames.TagReason, "prefill_error", "fallbacks")); got != 1 {
				t.Errorf("fallback.prefill_error = %d", got)
			}
			if got := counter(s.host, "kvroute.pd.requests.late_fallback"); got != 1 {
				t.Errorf("late_fallback = %d", got)
			}
			// The decode-only re-send carries the client's body.
			var plain int
			for _, e := range s.decode.inference() {
				if string(e.body) == body {
					plain++
					if stream {
						sse(t, e.respBody)
					}
				}
			}
			if plain != 1 {
				t.Errorf("%d decode-only requests with the client's body, want 1", plain)
			}
			if stream {
				sse(t, r.body)
			} else if gjson.GetBytes(r.body, "usage.completion_tokens").Int() != 4 {
				t.Errorf("body %s", r.body)
			}
		})
	}
}

// A prefill that answers only after pd.timeoutMs counts as a timeout (SGLang).
func TestSGLangPrefillTimeout(t *testing.T) {
	f := engines(t, 0.05)
	slow := fakePrefill(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/kvroute-sim/bootstrap/") {
			http.Error(w, "no room", 404)
			return
		}
		select {
		case <-time.After(3 * time.Second):
		case <-r.Context().Done():
		}
	})
	s := start(t, `{"protocol":"sglang","bootstrapPort":0,"timeoutMs":200}`, slow, proxyTo(t, f.Servers[1].Addr))
	r := s.send(t, "/v1/completions", completion(700, 3, false, "sglslow"))
	if r.status != 200 {
		t.Fatalf("client got %d (%s)", r.status, r.body)
	}
	if m := r.header.Get(markerHeader); m != "fallback=prefill_timeout" {
		t.Errorf("marker %q", m)
	}
	if got := counter(s.host, statnames.Tagged(statnames.PD, statnames.TagReason, "prefill_timeout", "fallbacks")); got != 1 {
		t.Errorf("fallback.prefill_timeout = %d", got)
	}
}

// Without allow_on_headers_stop_iteration the host (as Envoy) holds the body
// back while kvroute.pd holds the headers: after a short wait the filter
// sends the request on decode-only instead of letting it hang.
func TestWithoutAllowOnHeadersStopIterationGoesDecodeOnly(t *testing.T) {
	f := engines(t, 0.05)
	s := startAllow(t, "", proxyTo(t, f.Servers[0].Addr), proxyTo(t, f.Servers[1].Addr), false)
	body := completion(900, 3, true, "noallow")
	t0 := time.Now()
	r := s.send(t, "/v1/completions", body)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if m := r.header.Get(markerHeader); m != "fallback=no_body" {
		t.Errorf("marker %q, want fallback=no_body", m)
	}
	if took := time.Since(t0); took > 5*time.Second {
		t.Errorf("took %v: the wait should be about 2 s", took)
	}
	if n := len(s.prefill.inference()); n != 0 {
		t.Errorf("%d prefill requests", n)
	}
	if dec := s.decode.inference(); len(dec) != 1 || string(dec[0].body) != body {
		t.Errorf("decode did not get the client's body")
	}
	if got := counter(s.host, statnames.Tagged(statnames.PD, statnames.TagReason, "no_body", "fallbacks")); got != 1 {
		t.Errorf("fallback.no_body = %d", got)
	}
	if len(s.host.LogsContaining("allow_on_headers_stop_iteration")) == 0 {
		t.Errorf("no log line tells the operator what to set")
	}
	sse(t, r.body)
}
