package scrape

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
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
	start := time.Now()
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	// It keeps scraping: five good scrapes, however long a loaded machine
	// takes for them.
	if !testenv.Poll(testenv.WaitTimeout, func() bool { return results.Load() >= 5 }) {
		t.Errorf("%d good scrapes in %v at a 20 ms interval", results.Load(), testenv.WaitTimeout)
	}
	cancel()
	<-done
	// And never faster than its interval: one at once, then at most one
	// per tick (no stacking), whatever the time it was given.
	elapsed := time.Since(start)
	if n, most := results.Load(), 1+int64(elapsed/l.Interval); n > most {
		t.Errorf("%d scrapes in %v at a 20 ms interval: at most %d", n, elapsed, most)
	}
}
