package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/internal/testenv"
)

// The response shapes of the OpenAI API as the official clients declare
// them (openai-go / openai-python): what a client needs must be there with
// the right types. Decoding is strict about types, lenient about extra
// fields (vLLM adds some, and so do clients' own models).
type oaUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type oaCompletion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *oaUsage `json:"usage"`
}

type oaChat struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *oaUsage `json:"usage"`
}

func startFleet(t *testing.T, opt Options) *Fleet {
	t.Helper()
	if opt.TimeScale == 0 {
		opt.TimeScale = 0.01
	}
	f, err := Start(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func post(t *testing.T, addr, path string, body any, hdr ...string) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// sse reads a text/event-stream body into its data payloads, checking the
// stream ends with [DONE].
func sse(t *testing.T, resp *http.Response) []string {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("streamed response has Content-Type %q", ct)
	}
	var out []string
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("SSE line without data: prefix: %q", line)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		if done {
			t.Fatal("data after [DONE]")
		}
		out = append(out, data)
	}
	if !done {
		t.Fatal("stream did not end with data: [DONE]")
	}
	return out
}

func longPrompt(seed, tokens int) string {
	var b strings.Builder
	for b.Len() < tokens*4 {
		fmt.Fprintf(&b, "w%d-%d ", seed, b.Len())
	}
	return b.String()[:tokens*4]
}

func TestCompletionsNonStreamedAndStreamed(t *testing.T) {
	f := startFleet(t, Options{})
	addr := f.Addrs()[0]
	prompt := longPrompt(1, 1000)

	resp := post(t, addr, "/v1/completions", map[string]any{"model": "llama-3-8b", "prompt": prompt, "max_tokens": 5})
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var c oaCompletion
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		t.Fatal(err)
	}
	if c.Object != "text_completion" || c.ID == "" || c.Created == 0 || c.Model != "llama-3-8b" || len(c.Choices) != 1 {
		t.Fatalf("bad completion envelope: %+v", c)
	}
	if c.Choices[0].FinishReason == nil || *c.Choices[0].FinishReason != "length" || len(strings.Fields(c.Choices[0].Text)) != 5 {
		t.Fatalf("choice %+v: want 5 words and finish_reason length", c.Choices[0])
	}
	if c.Usage == nil || c.Usage.PromptTokens != 1000 || c.Usage.CompletionTokens != 5 || c.Usage.TotalTokens != 1005 || c.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("usage %+v: want 1000 prompt, 5 completion, 0 cached", c.Usage)
	}

	// Same prompt, streamed, with usage: its prefix is now cached.
	resp = post(t, addr, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 4, "stream": true, "stream_options": map[string]any{"include_usage": true}})
	chunks := sse(t, resp)
	if len(chunks) != 5 {
		t.Fatalf("%d chunks, want 4 tokens + 1 usage", len(chunks))
	}
	var text strings.Builder
	for i, ch := range chunks {
		var c oaCompletion
		if err := json.Unmarshal([]byte(ch), &c); err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		if c.Object != "text_completion" {
			t.Fatalf("chunk object %q", c.Object)
		}
		if i < 4 {
			text.WriteString(c.Choices[0].Text)
			last := c.Choices[0].FinishReason != nil
			if last != (i == 3) {
				t.Fatalf("chunk %d finish_reason %v", i, c.Choices[0].FinishReason)
			}
			continue
		}
		if len(c.Choices) != 0 || c.Usage == nil {
			t.Fatalf("final chunk should carry usage and no choices: %s", ch)
		}
		if got := c.Usage.PromptTokensDetails.CachedTokens; got != 992 {
			t.Fatalf("repeated 1000-token prompt: cached_tokens %d, want 992 (62 full 16-token blocks; the last is recomputed)", got)
		}
	}
	if len(strings.Fields(text.String())) != 4 {
		t.Fatalf("streamed text %q is not 4 tokens", text.String())
	}
}

func TestChatNonStreamedAndStreamed(t *testing.T) {
	f := startFleet(t, Options{})
	addr := f.Addrs()[0]
	msgs := []map[string]any{
		{"role": "system", "content": longPrompt(2, 500)},
		{"role": "user", "content": []map[string]any{{"type": "text", "text": "hello there"}}},
	}
	resp := post(t, addr, "/v1/chat/completions", map[string]any{"model": "llama-3-8b", "messages": msgs, "max_tokens": 3})
	var c oaChat
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || c.Object != "chat.completion" || len(c.Choices) != 1 || c.Choices[0].Message.Role != "assistant" || c.Choices[0].Message.Content == "" {
		t.Fatalf("status %d, bad chat completion: %+v", resp.StatusCode, c)
	}
	if c.Usage == nil || c.Usage.CompletionTokens != 3 || c.Usage.PromptTokens < 500 {
		t.Fatalf("usage %+v", c.Usage)
	}

	// Next turn: history grows, the earlier turn's blocks are cached.
	msgs = append(msgs, map[string]any{"role": "assistant", "content": c.Choices[0].Message.Content}, map[string]any{"role": "user", "content": "and then?"})
	resp = post(t, addr, "/v1/chat/completions", map[string]any{"messages": msgs, "max_completion_tokens": 2, "stream": true, "stream_options": map[string]any{"include_usage": true}})
	chunks := sse(t, resp)
	if len(chunks) != 3 {
		t.Fatalf("%d chunks, want 2 tokens + usage", len(chunks))
	}
	var first oaChat
	json.Unmarshal([]byte(chunks[0]), &first)
	if first.Object != "chat.completion.chunk" || first.Choices[0].Delta.Role != "assistant" || first.Choices[0].Delta.Content == "" {
		t.Fatalf("first chunk %s", chunks[0])
	}
	var last oaChat
	json.Unmarshal([]byte(chunks[2]), &last)
	if last.Usage == nil || last.Usage.PromptTokensDetails.CachedTokens != 496 {
		// Turn one renders to 2,047 bytes = 31 full 16-token blocks.
		t.Fatalf("second turn should hit the first turn's 31 full blocks (496 tokens): %s", chunks[2])
	}
}

func TestMetricsUseVLLMNamesAndCountHits(t *testing.T) {
	f := startFleet(t, Options{KVBlocks: 1000})
	addr := f.Addrs()[0]
	p := longPrompt(3, 800)
	for range 2 {
		resp := post(t, addr, "/v1/completions", map[string]any{"prompt": p, "max_tokens": 1})
		io.Copy(io.Discard, resp.Body)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := expfmt.ResponseFormat(resp.Header); ct.FormatType() != expfmt.TypeTextPlain {
		t.Fatalf("/metrics Content-Type %q is not the Prometheus text format", resp.Header.Get("Content-Type"))
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	m, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	label := func(mt *dto.Metric, name string) string {
		for _, l := range mt.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	one := func(name string) (*dto.Metric, float64) {
		f, ok := m[name]
		if !ok || len(f.GetMetric()) != 1 {
			t.Fatalf("%s: missing or not one sample", name)
		}
		mt := f.GetMetric()[0]
		if label(mt, "model_name") != "llama-3-8b" {
			t.Fatalf("%s lacks the model_name label", name)
		}
		if f.GetType() == dto.MetricType_COUNTER {
			return mt, mt.GetCounter().GetValue()
		}
		return mt, mt.GetGauge().GetValue()
	}
	value := func(name string) float64 { _, v := one(name); return v }
	for _, name := range []string{"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"} {
		if v := value(name); v != 0 {
			t.Fatalf("%s = %g on an idle engine", name, v)
		}
	}
	if q, h := value("vllm:prefix_cache_queries_total"), value("vllm:prefix_cache_hits_total"); q != 1600 || h != 784 {
		t.Fatalf("prefix cache queries %g hits %g, want 1600 and 784", q, h)
	}
	cc, _ := one("vllm:cache_config_info")
	if label(cc, "block_size") != "16" || label(cc, "num_gpu_blocks") != "1000" {
		t.Fatalf("cache_config_info labels %v", cc.GetLabel())
	}
}

func TestORCAHeaderOnRequest(t *testing.T) {
	f := startFleet(t, Options{})
	addr := f.Addrs()[0]
	resp := post(t, addr, "/v1/completions", map[string]any{"prompt": "hi there", "max_tokens": 1})
	if h := resp.Header.Get("endpoint-load-metrics"); h != "" {
		t.Fatalf("ORCA header sent unasked: %q", h)
	}
	resp = post(t, addr, "/v1/completions", map[string]any{"prompt": "hi there", "max_tokens": 1}, "endpoint-load-metrics-format", "TEXT")
	h := resp.Header.Get("endpoint-load-metrics")
	if !strings.HasPrefix(h, "TEXT ") || !strings.Contains(h, "named_metrics.kv_cache_usage_perc=") || !strings.Contains(h, "named_metrics.num_requests_waiting=") {
		t.Fatalf("TEXT ORCA header %q", h)
	}
	resp = post(t, addr, "/v1/completions", map[string]any{"prompt": "hi there", "max_tokens": 1}, "endpoint-load-metrics-format", "JSON")
	h = resp.Header.Get("endpoint-load-metrics")
	var j struct {
		Named map[string]float64 `json:"named_metrics"`
	}
	if js, ok := strings.CutPrefix(h, "JSON "); !ok || json.Unmarshal([]byte(js), &j) != nil || len(j.Named) < 2 {
		t.Fatalf("JSON ORCA header %q", h)
	}
}

func TestNixlPrefillThenDecode(t *testing.T) {
	f := startFleet(t, Options{Replicas: 2, Roles: []string{"prefill", "decode"}})
	pAddr, dAddr := f.Addrs()[0], f.Addrs()[1]
	prompt := longPrompt(4, 2000)
	resp := post(t, pAddr, "/v1/completions", map[string]any{
		"prompt": prompt, "max_tokens": 1,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil},
	})
	var pr struct {
		KV map[string]any `json:"kv_transfer_params"`
	}
	json.NewDecoder(resp.Body).Decode(&pr)
	if pr.KV == nil || pr.KV["do_remote_prefill"] != true || pr.KV["remote_engine_id"] == nil || pr.KV["remote_host"] != "127.0.0.1" {
		t.Fatalf("prefill response kv_transfer_params %v", pr.KV)
	}
	if ids, _ := pr.KV["remote_block_ids"].([]any); len(ids) != 125 {
		t.Fatalf("%d remote block ids for 2000 tokens, want 125", len(ids))
	}
	resp = post(t, dAddr, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 3, "kv_transfer_params": pr.KV})
	var c oaCompletion
	json.NewDecoder(resp.Body).Decode(&c)
	if c.Usage == nil || c.Usage.PromptTokensDetails.CachedTokens != 1999 {
		t.Fatalf("decode with transferred KV: usage %+v, want 1999 cached (all but the last token)", c.Usage)
	}
	if s := f.Servers[1].Stats(); s.PromptTokens != 1 {
		t.Fatalf("decode server prefilled %d tokens, want 1", s.PromptTokens)
	}
}

func TestSGLangBootstrapPairing(t *testing.T) {
	f := startFleet(t, Options{Replicas: 2, Roles: []string{"prefill", "decode"}})
	pAddr, dAddr := f.Addrs()[0], f.Addrs()[1]
	host, port := splitHostPort(pAddr)
	body := map[string]any{"prompt": longPrompt(5, 1500), "max_tokens": 2, "bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": 424242}
	var wg sync.WaitGroup
	var decoded oaCompletion
	var decodeStatus int
	decodeStart := time.Now()
	var decodeEnd time.Time
	wg.Go(func() {
		b, _ := json.Marshal(body)
		resp, err := http.Post("http://"+dAddr+"/v1/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			return
		}
		defer resp.Body.Close()
		decodeStatus = resp.StatusCode
		json.NewDecoder(resp.Body).Decode(&decoded)
		decodeEnd = time.Now()
	})
	// The decode side is waiting for its room: its bootstrap GET made it
	// on the prefill server, which has not seen the request yet.
	testenv.WaitFor(t, "the decode side waiting for bootstrap room 424242", func() bool {
		rs := &f.Servers[0].rooms
		rs.mu.Lock()
		defer rs.mu.Unlock()
		_, ok := rs.m[424242]
		return ok
	})
	prefillStart := time.Now()
	resp := post(t, pAddr, "/v1/completions", body)
	io.Copy(io.Discard, resp.Body)
	wg.Wait()
	if decodeStatus != 200 || decoded.Usage == nil || decoded.Usage.PromptTokensDetails.CachedTokens != 1499 {
		t.Fatalf("decode status %d usage %+v", decodeStatus, decoded.Usage)
	}
	if decodeEnd.Before(prefillStart) {
		t.Fatalf("decode finished (%v) before prefill started (%v)", decodeEnd.Sub(decodeStart), prefillStart.Sub(decodeStart))
	}
	// Bootstrap fields on an aggregated server are a client mistake.
	g := startFleet(t, Options{})
	resp = post(t, g.Addrs()[0], "/v1/completions", body)
	if resp.StatusCode != 400 {
		t.Fatalf("bootstrap on role both: status %d", resp.StatusCode)
	}
}

func TestBadRequestsGetVLLMErrors(t *testing.T) {
	f := startFleet(t, Options{MaxModelLen: 4096})
	addr := f.Addrs()[0]
	cases := []struct {
		name, path, body string
		status           int
		contains         string
	}{
		{"truncated JSON", "/v1/completions", `{"prompt": "a`, 400, "invalid JSON"},
		{"empty body", "/v1/completions", ``, 400, "empty"},
		{"missing prompt", "/v1/completions", `{"model":"llama-3-8b"}`, 400, "prompt is required"},
		{"prompt wrong type", "/v1/completions", `{"prompt": {"a":1}}`, 400, "prompt must be"},
		{"max_tokens zero", "/v1/completions", `{"prompt":"x","max_tokens":0}`, 400, "max_tokens must be at least 1"},
		{"unknown model", "/v1/completions", `{"model":"gpt-9","prompt":"x"}`, 404, "does not exist"},
		{"too long", "/v1/completions", `{"prompt":"` + strings.Repeat("a", 4*4100) + `"}`, 400, "maximum context length is 4096"},
		{"n > 1", "/v1/completions", `{"prompt":"x","n":2}`, 400, "n must be 1"},
		{"stream_options without stream", "/v1/completions", `{"prompt":"x","stream_options":{"include_usage":true}}`, 400, "stream=True"},
		{"no messages", "/v1/chat/completions", `{"messages":[]}`, 400, "messages"},
		{"message without role", "/v1/chat/completions", `{"messages":[{"content":"x"}]}`, 400, "role is required"},
		{"content wrong type", "/v1/chat/completions", `{"messages":[{"role":"user","content":5}]}`, 400, "content"},
		{"half a bootstrap", "/v1/completions", `{"prompt":"x","bootstrap_room":1}`, 400, "go together"},
		{"remote prefill without params", "/v1/completions", `{"prompt":"x","kv_transfer_params":{"do_remote_prefill":true}}`, 400, "remote_engine_id"},
	}
	for _, c := range cases {
		resp, err := http.Post("http://"+addr+c.path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		var e apiError
		err = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != c.status || err != nil || e.Error.Code != c.status || !strings.Contains(e.Error.Message, c.contains) || e.Error.Type == "" {
			t.Errorf("%s: status %d, error %+v (decode %v); want %d mentioning %q", c.name, resp.StatusCode, e.Error, err, c.status, c.contains)
		}
	}
	resp, _ := http.Get("http://" + addr + "/v1/completions")
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Errorf("GET on completions: status %d, want 405", resp.StatusCode)
	}
	// The engine served nothing and is still healthy.
	resp = post(t, addr, "/v1/completions", map[string]any{"prompt": "still alive", "max_tokens": 1})
	if resp.StatusCode != 200 {
		t.Fatalf("engine unhealthy after bad requests: %d", resp.StatusCode)
	}
}

func TestClientGoneAbortsRequest(t *testing.T) {
	f := startFleet(t, Options{TimeScale: 0.2})
	addr := f.Addrs()[0]
	ctx, cancel := context.WithCancel(context.Background())
	b, _ := json.Marshal(map[string]any{"prompt": longPrompt(6, 1000), "max_tokens": 5000, "stream": true})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/completions", bytes.NewReader(b))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	br.ReadString('\n') // the first token arrived
	cancel()
	resp.Body.Close()
	if testenv.Poll(5*time.Second, func() bool {
		s := f.Servers[0].Stats()
		return s.Running == 0 && s.Waiting == 0 && s.KVUsage == 0
	}) {
		return
	}
	t.Fatalf("request still in the engine after its client left: %+v", f.Servers[0].Stats())
}

func TestPortBaseAndClose(t *testing.T) {
	f, err := Start(Options{Replicas: 3, TimeScale: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	addrs := f.Addrs()
	if len(addrs) != 3 || addrs[0] == addrs[1] {
		t.Fatalf("addresses %v", addrs)
	}
	for _, a := range addrs {
		resp, err := http.Get("http://" + a + "/health")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s not healthy: %v", a, err)
		}
		resp.Body.Close()
	}
	if err := f.Servers[1].Close(); err != nil { // kill one replica first
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := http.Get("http://" + addrs[0] + "/health"); err == nil {
		t.Fatal("server still answering after Close")
	}
	if _, err := Start(Options{Role: "sideways"}); err == nil {
		t.Fatal("bad role accepted")
	}
}
