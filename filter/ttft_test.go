package filter

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
)

// sseUpstream streams a completion whose first token comes after delay,
// then a usage event and [DONE].
func sseUpstream(t *testing.T, delay time.Duration) string {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("content-type", "text/event-stream")
		f, _ := w.(http.Flusher)
		f.Flush() // headers first, as vLLM sends them
		time.Sleep(delay)
		io.WriteString(w, `data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":"tok"}]}`+"\n\n")
		f.Flush()
		time.Sleep(time.Millisecond)
		io.WriteString(w, `data: {"id":"c","object":"text_completion","choices":[],"usage":{"prompt_tokens":300,"prompt_tokens_details":{"cached_tokens":0}}}`+"\n\n")
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	return up.Listener.Addr().String()
}

// A profile scoring by predicted TTFT learns, from streamed responses'
// first chunks and usage, that one engine answers 16x slower, and stops
// sending it work; both workers score with the models in shared data.
func TestWasmPredictedTTFTLearnsTheSlowEngine(t *testing.T) {
	fast, slow := sseUpstream(t, 5*time.Millisecond), sseUpstream(t, 80*time.Millisecond)
	addrs := []string{fast, slow}
	h, url := startRouter(t, addrs, 2, `,"fallbacks":0,"strategy":"p","profiles":{"p":{"filters":["healthy"],
		"scorers":[{"plugin":"predicted_ttft","weight":1}],"picker":"max_score"}}`)
	send := func(n, from int) map[string]int {
		before := h.UpstreamRequests()
		for i := from; i < from+n; i++ {
			body := fmt.Sprintf(`{"model":"llama-3-8b","prompt":"q%d %s","max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`, i, strings.Repeat("w ", 100+20*(i%5)))
			code, resp, _ := testenv.Call(t, "POST", url+"/v1/completions", body, nil)
			if code != 200 || !strings.Contains(resp, "[DONE]") {
				t.Fatalf("request %d: %d %s", i, code, resp)
			}
		}
		after := h.UpstreamRequests()
		return map[string]int{"fast": after[fast] - before[fast], "slow": after[slow] - before[slow]}
	}
	warm := send(16, 0)
	if warm["slow"] == 0 {
		t.Fatalf("warm-up never tried the slow engine: %v", warm)
	}
	if v, _, ok := h.SharedData("kvroute/ttft"); !ok || len(v) < 2*44 {
		t.Fatalf("shared data holds %d bytes of TTFT models (found %v), want two hosts' records", len(v), ok)
	}
	if got := send(20, 100); got["slow"] > 1 {
		t.Errorf("after learning: %v, want (almost) every request on the fast engine", got)
	}
}
