package metricsvc

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/metricsvc/discovery"
	"github.com/kvroute/kvroute/internal/metricsvc/push"
	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/wasmhosttest"
	"github.com/kvroute/kvroute/snapshot"
)

// servingEngine answers /metrics with a queue length the test sets, and
// completions with a fixed body: enough for the router to route to it.
type servingEngine struct {
	waiting atomic.Int64
	served  atomic.Int64
	srv     *httptest.Server
}

func newServingEngine(t *testing.T) *servingEngine {
	e := &servingEngine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			fmt.Fprintf(w, "vllm:num_requests_waiting{model_name=\"m\"} %d\nvllm:num_requests_running{model_name=\"m\"} 0\n", e.waiting.Load())
			return
		}
		io.Copy(io.Discard, r.Body)
		e.served.Add(1)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":5,"completion_tokens":1}}`)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *servingEngine) addr() string { return e.srv.Listener.Addr().String() }

// TestRealGateway pushes to the Wasm host (internal/sim/wasmhost, Envoy's
// proxy-wasm ABI on wazero) running the router filter from
// dist/kvroute.wasm: the right token's pushes are applied and steer the
// decision as the engines' queues change; a service with a wrong token is
// refused and changes nothing.
func TestRealGateway(t *testing.T) {
	mod := testenv.Module(t)
	e1, e2, decoy := newServingEngine(t), newServingEngine(t), newServingEngine(t)
	cfg := fmt.Sprintf(`{
		"endpoints": [{"address": %q}, {"address": %q}],
		"strategy": "by_queue",
		"profiles": {"by_queue": {"filters": ["healthy"], "scorers": [{"plugin": "queue", "weight": 1}], "picker": "max_score", "allowHotspot": true}},
		"state": {"token": "s3cret"},
		"fallbacks": 0}`, e1.addr(), e2.addr())
	host, frontURL := wasmhosttest.Start(t, wasmhost.Config{
		Module:       mod,
		VMID:         "kvroute",
		Filters:      []wasmhost.Filter{{RootID: "kvroute.router", Configuration: cfg, AllowOnHeadersStopIteration: true}},
		Clusters:     map[string][]string{"engines": {e1.addr(), e2.addr(), decoy.addr()}},
		RouteCluster: "engines",
	})
	stateURL := frontURL + "/.kvroute/v1/state"

	e1.waiting.Store(40)
	e2.waiting.Store(0)
	// A generous scrape timeout: on a loaded shared machine a 40 ms timeout
	// flaps engines unhealthy now and then, which legitimately moves a
	// request and would blur what this test checks.
	svc, _, admin := startService(t, Config{
		Source:         discovery.Fixed{{Address: e1.addr()}, {Address: e2.addr()}},
		ScrapeInterval: 50 * time.Millisecond,
		ScrapeTimeout:  time.Second,
		Gateways:       []string{stateURL},
		Token:          push.StaticToken("s3cret"),
		PushInterval:   100 * time.Millisecond,
	})
	// A second service with the wrong token that sees only the decoy: were
	// its pushes applied, every request would go to the decoy.
	_, _, wrongAdmin := startService(t, Config{
		Name:           "intruder",
		Source:         discovery.Fixed{{Address: decoy.addr()}},
		ScrapeInterval: 50 * time.Millisecond,
		Gateways:       []string{stateURL},
		Token:          push.StaticToken("not-the-token"),
	})

	seq := 0
	send := func() {
		t.Helper()
		seq++
		body := fmt.Sprintf(`{"model":"m","prompt":"distinct prompt number %d"}`, seq)
		resp, err := http.Post(frontURL+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", seq, resp.StatusCode)
		}
	}
	// routeTo waits until the gateway holds a snapshot with want's queue
	// shorter (the service published it, and two more pushes succeeded
	// after that, so one started after it), then checks that n requests
	// all go to want.
	routeTo := func(want, other *servingEngine, n int) {
		t.Helper()
		var st snapshot.State
		if !testenv.Poll(testenv.WaitTimeout, func() bool {
			st = svc.Snapshot()
			hw, _ := hostOf(st, want.addr())
			ho, _ := hostOf(st, other.addr())
			return hw.Healthy && ho.Healthy && hw.Waiting < ho.Waiting
		}) {
			t.Fatalf("the service never published the new queues: %+v", st)
		}
		ok0 := svc.pusher.Stats()[0].OK
		if !testenv.Poll(testenv.WaitTimeout, func() bool { return svc.pusher.Stats()[0].OK >= ok0+2 }) {
			t.Fatalf("no pushes reached the gateway (applied: %d)", host.CounterValue("kvroute.router.state.pushes"))
		}
		w0, o0 := want.served.Load(), other.served.Load()
		for range n {
			send()
		}
		if got := want.served.Load() - w0; got != int64(n) {
			t.Errorf("%d of %d requests went to the engine with the shorter pushed queue (the other got %d)", got, n, other.served.Load()-o0)
		}
	}
	routeTo(e2, e1, 10)
	e1.waiting.Store(0)
	e2.waiting.Store(40)
	routeTo(e1, e2, 10)

	if n := host.CounterValue("kvroute.router.state.pushes"); n < 2 {
		t.Errorf("state.pushes = %d", n)
	}
	if n := host.CounterValue("kvroute.router.state.unauthorized"); n < 1 {
		t.Errorf("state.unauthorized = %d: the wrong token's pushes were not refused", n)
	}
	if decoy.served.Load() != 0 {
		t.Errorf("the decoy served %d requests: a wrong-token push was applied", decoy.served.Load())
	}
	_, text := get(t, admin+"/metrics")
	if v, _ := metricValue(text, fmt.Sprintf(`kvroute_metrics_pushes_total{gateway=%q,result="ok"}`, stateURL)); v < 2 {
		t.Errorf("service pushes ok = %v", v)
	}
	_, text = get(t, wrongAdmin+"/metrics")
	if v, _ := metricValue(text, fmt.Sprintf(`kvroute_metrics_pushes_total{gateway=%q,result="unauthorized"}`, stateURL)); v < 1 {
		t.Errorf("wrong-token service: unauthorized pushes = %v", v)
	}
}
