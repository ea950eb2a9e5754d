// Package replay sends a workload to an OpenAI-compatible endpoint over real
// HTTP at the workload's arrival times and measures what a client sees:
// time to first token, time per output token, end-to-end latency, and the
// cached prompt tokens the engine reports in usage. The demo uses it to
// compare strategies through the Wasm filter and simulated engines.
package replay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/sim/workload"
)

// Options controls a replay.
type Options struct {
	// BaseURL is the gateway (or engine), e.g. http://127.0.0.1:8080.
	BaseURL string
	// TimeScale stretches the workload's arrival times (wall = arrival x
	// TimeScale), matching the engines' time scale. 0 means 1.
	TimeScale float64
	// MaxInFlight bounds concurrent requests (default 512).
	MaxInFlight int
	// Timeout bounds each request (default 2 minutes).
	Timeout time.Duration
	// SessionHeader, when set, carries each request's session id.
	SessionHeader string
	// Client is the HTTP client (default: a keep-alive client).
	Client *http.Client
}

// Record is one request's outcome as the client saw it.
type Record struct {
	Status       int
	Err          string
	Replica      string // x-sim-replica response header, when present
	PromptTokens int
	OutputTokens int
	CachedTokens int
	TTFT, E2E    time.Duration
	TPOT         time.Duration // 0 with fewer than 2 tokens
}

// Run replays w and returns one record per request, in workload order.
func Run(ctx context.Context, w *workload.Workload, opt Options) ([]Record, error) {
	if opt.BaseURL == "" {
		return nil, errors.New("replay needs a base URL")
	}
	if opt.TimeScale <= 0 {
		opt.TimeScale = 1
	}
	if opt.MaxInFlight <= 0 {
		opt.MaxInFlight = 512
	}
	if opt.Timeout <= 0 {
		opt.Timeout = 2 * time.Minute
	}
	client := opt.Client
	if client == nil {
		client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: opt.MaxInFlight, MaxConnsPerHost: opt.MaxInFlight}}
	}
	recs := make([]Record, len(w.Requests))
	sem := make(chan struct{}, opt.MaxInFlight)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range w.Requests {
		r := &w.Requests[i]
		at := start.Add(time.Duration(float64(r.Arrival) * opt.TimeScale))
		if d := time.Until(at); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				wg.Wait()
				return recs, ctx.Err()
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return recs, ctx.Err()
		}
		wg.Go(func() {
			defer func() { <-sem }()
			rctx, cancel := context.WithTimeout(ctx, opt.Timeout)
			defer cancel()
			recs[i] = send(rctx, client, opt, r)
		})
	}
	wg.Wait()
	return recs, nil
}

// body renders the request as a client would send it: streamed, asking for
// usage in the final chunk, exactly OutputTokens tokens.
func body(r *workload.Request) ([]byte, string) {
	m := map[string]any{
		"model":          r.Model,
		"max_tokens":     r.OutputTokens,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	}
	if r.Chat() {
		msgs := make([]map[string]string, len(r.Messages))
		for i, x := range r.Messages {
			msgs[i] = map[string]string{"role": x.Role, "content": x.Content}
		}
		m["messages"] = msgs
		b, _ := json.Marshal(m)
		return b, "/v1/chat/completions"
	}
	m["prompt"] = r.Text()
	b, _ := json.Marshal(m)
	return b, "/v1/completions"
}

func send(ctx context.Context, client *http.Client, opt Options, r *workload.Request) Record {
	rec := Record{PromptTokens: r.PromptTokens}
	b, path := body(r)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(opt.BaseURL, "/")+path, bytes.NewReader(b))
	if err != nil {
		rec.Err = err.Error()
		return rec
	}
	req.Header.Set("Content-Type", "application/json")
	if opt.SessionHeader != "" && r.Session != "" {
		req.Header.Set(opt.SessionHeader, r.Session)
	}
	t0 := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		rec.Err = err.Error()
		return rec
	}
	defer resp.Body.Close()
	rec.Status = resp.StatusCode
	rec.Replica = resp.Header.Get("x-sim-replica")
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		rec.Err = fmt.Sprintf("status %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
		return rec
	}
	var first, last time.Time
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens    int `json:"completion_tokens"`
				PromptTokensDetails *struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			rec.Err = "bad SSE chunk: " + err.Error()
			return rec
		}
		if len(chunk.Choices) > 0 && (chunk.Choices[0].Text != "" || chunk.Choices[0].Delta.Content != "") {
			now := time.Now()
			if first.IsZero() {
				first = now
			}
			last = now
		}
		if chunk.Usage != nil {
			rec.OutputTokens = chunk.Usage.CompletionTokens
			if d := chunk.Usage.PromptTokensDetails; d != nil {
				rec.CachedTokens = d.CachedTokens
			}
		}
	}
	if err := sc.Err(); err != nil {
		rec.Err = err.Error()
		return rec
	}
	end := time.Now()
	if first.IsZero() {
		rec.Err = "no tokens in the stream"
		return rec
	}
	rec.TTFT, rec.E2E = first.Sub(t0), end.Sub(t0)
	if rec.OutputTokens > 1 {
		rec.TPOT = last.Sub(first) / time.Duration(rec.OutputTokens-1)
	}
	return rec
}
