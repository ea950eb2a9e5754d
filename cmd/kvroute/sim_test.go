package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/internal/testenv"
)

// freePortPair returns a port P such that P and P+1 are both free on
// loopback (sim puts its replicas on consecutive ports).
func freePortPair(t *testing.T) int {
	t.Helper()
	for range 50 {
		l1, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l1.Addr().(*net.TCPAddr).Port
		l2, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1))
		l1.Close()
		if err == nil {
			l2.Close()
			return p
		}
	}
	t.Fatal("no two consecutive free loopback ports")
	return 0
}

// startSim runs `kvroute sim args...` until ctx ends and waits for it to
// announce "serving". The returned channel yields the command's result.
func startSim(t *testing.T, ctx context.Context, args ...string) (*testenv.LockedBuffer, <-chan error) {
	t.Helper()
	out := &testenv.LockedBuffer{} // stdout of the command running in another goroutine
	done := make(chan error, 1)
	go func() { done <- execCLI(t, ctx, out, append([]string{"sim"}, args...)...) }()
	deadline := time.After(15 * time.Second)
	for !strings.Contains(out.String(), "serving; Ctrl-C to stop") {
		select {
		case err := <-done:
			t.Fatalf("kvroute sim ended before serving: %v\n%s", err, out.String())
		case <-deadline:
			t.Fatalf("kvroute sim did not start serving:\n%s", out.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return out, done
}

type completion struct {
	Choices []struct {
		Text string `json:"text"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func complete(t *testing.T, addr, prompt string) completion {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "llama-3-8b", "prompt": prompt, "max_tokens": 4})
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/completions on %s: %d %s", addr, resp.StatusCode, raw)
	}
	var c completion
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatalf("completion response: %v\n%s", err, raw)
	}
	return c
}

// counter reads a counter (one series) from an engine's /metrics.
func counter(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics on %s: %d", addr, resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics on %s does not parse: %v", addr, err)
	}
	f, ok := fams[name]
	if !ok || len(f.GetMetric()) != 1 {
		t.Fatalf("/metrics on %s has no single %s", addr, name)
	}
	return f.GetMetric()[0].GetCounter().GetValue()
}

// TestSimCommandServesAndStops runs `kvroute sim` itself on free loopback
// ports: both replicas answer completions and /metrics independently, and
// the command stops cleanly, freeing its ports, when its context ends and
// on SIGINT.
func TestSimCommandServesAndStops(t *testing.T) {
	port := freePortPair(t)
	a, b := fmt.Sprintf("127.0.0.1:%d", port), fmt.Sprintf("127.0.0.1:%d", port+1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, done := startSim(t, ctx, "--replicas", "2", "--port-base", fmt.Sprint(port), "--time-scale", "0")
	for _, addr := range []string{a, b} {
		if want := "engine " + addr + " role=both profile=llama3-8b-h100 model=llama-3-8b"; !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	prompt := strings.Repeat("the same long system prompt about routing ", 40)
	first := complete(t, b, prompt)
	if len(first.Choices) != 1 || first.Choices[0].Text == "" || first.Usage.CompletionTokens != 4 || first.Usage.PromptTokens < 100 {
		t.Errorf("first completion = %+v", first)
	}
	second := complete(t, b, prompt)
	if second.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Errorf("the repeated prompt hit no prefix cache: %+v", second.Usage)
	}
	if got := counter(t, b, "vllm:generation_tokens_total"); got != 8 {
		t.Errorf("engine b generated %v tokens, want 8", got)
	}
	if got := counter(t, b, "vllm:prefix_cache_hits_total"); got != float64(second.Usage.PromptTokensDetails.CachedTokens) {
		t.Errorf("engine b prefix cache hits = %v, the responses said %d", got, second.Usage.PromptTokensDetails.CachedTokens)
	}
	if got := counter(t, a, "vllm:generation_tokens_total"); got != 0 {
		t.Errorf("engine a generated %v tokens without a request", got)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("sim stopped with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("sim did not stop within 5 s of its context ending")
	}
	for _, addr := range []string{a, b} {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after sim stopped", addr)
		}
	}

	// Ctrl-C: the command catches it (the test process lives on) and ends.
	_, done = startSim(t, context.Background(), "--replicas", "1", "--port-base", "0", "--time-scale", "0")
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("sim stopped on SIGINT with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("sim did not stop within 5 s of SIGINT")
	}
}

func TestSimCommandBadInput(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	port := busy.Addr().(*net.TCPAddr).Port
	cases := map[string][]string{
		"pick another --port-base":        {"--port-base", fmt.Sprint(port)},
		"\"chef\" is not a role":          {"--port-base", "0", "--role", "chef"},
		"time scale must not be negative": {"--port-base", "0", "--time-scale", "-1"},
	}
	for want, args := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := execCLI(t, ctx, io.Discard, append([]string{"sim"}, args...)...)
		cancel()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("sim %v: error %v, want it to say %q", args, err, want)
		}
	}
}
