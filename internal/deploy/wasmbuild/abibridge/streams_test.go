package abibridge_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/wasmhosttest"
)

// moreThanTheTable is more streams than callbacks.go.in's table has slots
// (streamSlots, 1024), so that a stream created while the first one is
// still live finds that stream in its slot.
const moreThanTheTable = 1100

// The bridge keeps HTTP streams in a table of its own and falls back to the
// SDK's maps when a stream's slot is taken by a live one. This drives
// dist/kvroute.wasm on one worker through that fallback and back: a first
// stream held open while more than the table's worth of streams come and
// go, the last hundred of them also held (one of them takes the first
// stream's slot and lives in the SDK's maps, and those after it go there
// too while it lives), then all released, then a few more. Every stream
// must be routed and answered, and the VM must never fail (an unknown
// context id panics and traps it).
func TestStreamsOutliveTheTable(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 1100 streams through dist/kvroute.wasm")
	}
	module := testenv.Module(t)

	release := make(chan struct{})
	var received, waiting atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		received.Add(1)
		if r.Header.Get("x-test-hold") != "" {
			waiting.Add(1)
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"cmpl-1","choices":[{"text":"ok"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
	}))
	t.Cleanup(up.Close) // after the host's, which Start registers next
	addr := up.Listener.Addr().String()

	h, url := wasmhosttest.Start(t, wasmhost.Config{Module: module, VMID: "kvroute", Workers: 1,
		Clusters: map[string][]string{"engines": {addr}}, RouteCluster: "engines",
		Filters: []wasmhost.Filter{{RootID: "kvroute.router", AllowOnHeadersStopIteration: true,
			Configuration: fmt.Sprintf(`{"strategy":"round_robin","endpoints":[{"address":%q}]}`, addr)}}})
	// Unblock held upstream requests before the servers close, also when
	// the test fails half-way.
	var releaseOnce sync.Once
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	defer releaseAll()

	send := func(i int, hold bool) error {
		req, err := http.NewRequest("POST", url+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hello"}`))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		if hold {
			req.Header.Set("x-test-hold", "1")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("request %d: %d %s", i, resp.StatusCode, body)
		}
		return nil
	}
	waitReceived := func(n int64) {
		t.Helper()
		if !testenv.Poll(testenv.WaitTimeout, func() bool { return received.Load() >= n }) {
			t.Fatalf("the upstream received %d requests, want %d", received.Load(), n)
		}
	}

	var held sync.WaitGroup
	errs := make(chan error, moreThanTheTable+1)
	hold := func(i int) {
		held.Add(1)
		go func() {
			defer held.Done()
			if err := send(i, true); err != nil {
				errs <- err
			}
		}()
	}
	hold(0)
	waitReceived(1)
	for i := 1; i <= moreThanTheTable; i++ {
		if i <= moreThanTheTable-100 {
			if err := send(i, false); err != nil {
				t.Fatal(err)
			}
			continue
		}
		hold(i)
		waitReceived(int64(i + 1))
	}
	if got := waiting.Load(); got != 101 {
		t.Fatalf("%d streams held open, want 101", got)
	}
	releaseAll()
	held.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := 0; i < 10; i++ {
		if err := send(moreThanTheTable+1+i, false); err != nil {
			t.Fatal(err)
		}
	}

	const total = moreThanTheTable + 11
	if got := h.CounterValue("kvroute.router.requests.routed"); got != total {
		t.Errorf("kvroute.router.requests.routed = %d, want %d", got, total)
	}
	if h.VMFailures() != 0 {
		t.Errorf("VM failures: %v", h.LogsContaining("panic"))
	}
}
