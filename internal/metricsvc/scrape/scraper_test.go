package scrape

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

func TestLoopReasons(t *testing.T) {
	var mode atomic.Value
	mode.Store("ok")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode.Load().(string) {
		case "ok":
			fmt.Fprintln(w, "vllm:num_requests_waiting{model_name=\"m\"} 7")
		case "500":
			http.Error(w, "boom", 500)
		case "garbage":
			fmt.Fprintln(w, "vllm:num_requests_waiting{{{ 7")
		case "not_engine":
			fmt.Fprintln(w, "up 1")
		case "slow":
			select {
			case <-time.After(3 * time.Second):
			case <-r.Context().Done():
			}
			fmt.Fprintln(w, "vllm:num_requests_waiting 1")
		}
	}))
	defer srv.Close()
	// Generous timeouts except where the timeout is the point: the shared
	// machine can stall a loopback answer for a good fraction of a second.
	l := &Loop{Client: srv.Client(), Address: "a", URL: srv.URL + "/metrics", Interval: 50 * time.Millisecond, Timeout: 5 * time.Second}
	for _, c := range []struct{ mode, reason string }{
		{"ok", ""}, {"500", "status"}, {"garbage", "parse"}, {"not_engine", "not_engine"}, {"slow", "timeout"}, {"ok", ""},
	} {
		mode.Store(c.mode)
		l.Timeout = 5 * time.Second
		if c.mode == "slow" {
			l.Timeout = 100 * time.Millisecond
		}
		r := l.Once(context.Background())
		if r.Reason != c.reason || (r.Err == nil) != (c.reason == "") {
			t.Errorf("%s: reason=%q err=%v, want %q", c.mode, r.Reason, r.Err, c.reason)
		}
		if c.mode == "ok" && r.Sample.Waiting != 7 {
			t.Errorf("sample = %+v", r.Sample)
		}
	}
	srv.Close()
	if r := l.Once(context.Background()); r.Reason != "connect" {
		t.Errorf("closed server: reason=%q err=%v", r.Reason, r.Err)
	}
}

func TestLoopRunsAtInterval(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprintln(w, "vllm:num_requests_running 1")
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var results atomic.Int64
	l := &Loop{Client: srv.Client(), Address: "a", URL: srv.URL, Interval: 20 * time.Millisecond, Timeout: time.Second,
		Report: func(r Result) {
			if r.Err == nil {
				results.Add(1)
			}
		}}
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	time.Sleep(300 * time.Millisecond)
	cancel()
	<-done
	// 300 ms at 20 ms: about 15 scrapes, never more than the ticks (no
	// stacking); a loaded shared machine may manage far fewer.
	if n := results.Load(); n < 3 || n > 17 {
		t.Errorf("%d scrapes in 300 ms at a 20 ms interval", n)
	}
}
