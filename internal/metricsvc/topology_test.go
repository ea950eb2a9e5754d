package metricsvc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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

// Two gateways converge through the metrics service (docs/topology.md):
// each runs the router from dist/kvroute.wasm with state.report on, so its
// workers POST their routes to the service, which pushes them to the other
// gateway. A prompt routed by gateway A, sent again (with another ending)
// to gateway B, goes where A sent it: B marked A's route in its index.
// Without the reports B places it on its own (here: anywhere but A's host,
// since the engines' queues are equal and B has no prefix to follow).
func TestTwoGatewaysConvergeThroughReports(t *testing.T) {
	mod := testenv.Module(t)
	var engines []*servingEngine
	var addrs, eps []string
	var fixed discovery.Fixed
	for range 4 {
		e := newServingEngine(t)
		engines = append(engines, e)
		addrs = append(addrs, e.addr())
		eps = append(eps, fmt.Sprintf(`{"address": %q}`, e.addr()))
		fixed = append(fixed, discovery.Endpoint{Address: e.addr()})
	}
	// The service's own endpoints, reached by the gateways as the cluster
	// "metrics"; the handler is set once the service exists.
	var svcHandler atomic.Value
	metricsFront := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, _ := svcHandler.Load().(http.Handler)
		if h == nil {
			http.Error(w, "not yet", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(metricsFront.Close)
	gateway := func(report bool) (*wasmhost.Host, string) {
		rep := ""
		if report {
			rep = `, "report": {"cluster": "metrics", "intervalMs": 20}`
		}
		cfg := fmt.Sprintf(`{"endpoints": [%s], "state": {"token": "s3cret"%s}, "fallbacks": 0}`, strings.Join(eps, ","), rep)
		return wasmhosttest.Start(t, wasmhost.Config{
			Module: mod, VMID: "kvroute", Workers: 2, Dispatch: wasmhost.DispatchStream,
			Filters:      []wasmhost.Filter{{RootID: "kvroute.router", Configuration: cfg, AllowOnHeadersStopIteration: true}},
			Clusters:     map[string][]string{"engines": addrs, "metrics": {metricsFront.Listener.Addr().String()}},
			RouteCluster: "engines",
		})
	}
	hostA, urlA := gateway(true)
	hostB, urlB := gateway(true)
	_, urlC := gateway(false) // the control: reports nothing, pushed nothing but state
	// The service pushes to B through a relay that notes, per engine, the
	// first block of every route B accepted (B applies a push's routes
	// before it answers): the test waits for the push that carries A's
	// route, however late A's report or that push comes.
	var relayed sync.Map // engine address + first block hash: struct{}
	relayB := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, urlB+r.URL.Path, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var st snapshot.State
		if resp.StatusCode == http.StatusOK && json.Unmarshal(body, &st) == nil {
			for _, g := range st.Gateways {
				for _, rt := range g.Routes {
					if c := decodeChain(rt.Chain); rt.From == 0 && len(c) > 0 {
						relayed.Store(fmt.Sprint(rt.Address, " ", c[0]), struct{}{})
					}
				}
			}
		}
		w.WriteHeader(resp.StatusCode)
		w.Write(answer)
	}))
	t.Cleanup(relayB.Close)
	firstBlocks := func() map[string]bool {
		m := map[string]bool{}
		relayed.Range(func(k, _ any) bool { m[k.(string)] = true; return true })
		return m
	}
	svc, _, _ := startService(t, Config{
		Source: fixed, ScrapeInterval: 50 * time.Millisecond, ScrapeTimeout: time.Second,
		Gateways:     []string{urlA + "/.kvroute/v1/state", relayB.URL + "/.kvroute/v1/state"},
		Token:        push.StaticToken("s3cret"),
		PushInterval: 200 * time.Millisecond,
	})
	svcHandler.Store(svc.Handler())
	send := func(url, prompt string) int {
		t.Helper()
		before := make([]int64, len(engines))
		for i, e := range engines {
			before[i] = e.served.Load()
		}
		body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":1}`, prompt)
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
		if code := testenv.Drain(t, resp, err); code != 200 {
			t.Fatalf("status %d", code)
		}
		for i, e := range engines {
			if e.served.Load() != before[i] {
				return i
			}
		}
		t.Fatal("no engine served the request")
		return -1
	}
	testenv.WaitFor(t, "the first push to reach both gateways", func() bool {
		return len(svc.Snapshot().Hosts) >= 4 && hostA.CounterValue("kvroute.router.state.pushes") > 0 && hostB.CounterValue("kvroute.router.state.pushes") > 0
	})
	const n = 8
	followed, control := 0, 0
	for i := range n {
		prefix := fmt.Sprintf("Tenant %d handbook. ", i) + strings.Repeat(fmt.Sprintf("Section %d: be precise, cite, and keep answers short. ", i), 120)
		before := firstBlocks()
		a := send(urlA, prefix+"first question")
		// A reports its route on its report tick; the service pushes it to
		// B with its next snapshot. Wait for B to have accepted a route to
		// A's engine with a first block new since the request: A's (each
		// prompt's prefix is its own; B's routes come later).
		testenv.WaitFor(t, "gateway B to accept gateway A's route of prompt "+fmt.Sprint(i), func() bool {
			for k := range firstBlocks() {
				if !before[k] && strings.HasPrefix(k, addrs[a]+" ") {
					return true
				}
			}
			return false
		})
		if send(urlB, prefix+"second question") == a {
			followed++
		}
		if send(urlC, prefix+"second question") == a {
			control++
		}
	}
	t.Logf("gateway B followed gateway A's route for %d of %d prompts; a gateway without reports for %d", followed, n, control)
	if followed < n {
		t.Fatalf("gateway B followed gateway A's route for only %d of %d prompts", followed, n)
	}
	if control == n {
		t.Fatalf("the control gateway followed every route too: the test cannot tell reports from chance")
	}
}

// One report per gateway per interval (docs/topology.md, "Report"): a
// gateway of 4 workers (dist/kvroute.wasm in the Wasm host, streams handed
// to the workers in turn) gathers its workers' routes in shared data and
// one worker, the lease holder, POSTs them: every route arrives once,
// reports come at least an interval apart, and one report carries routes
// several workers decided. Each report carries the state token.
//
// The service holds the answer to the first report of each round until
// the round's requests are routed and every worker's tick has run: the
// holder sends nothing while its report is unanswered, so the round's 8
// routes (2 per worker) are in that report and the next one, and one of
// the two carries at least 4, however slowly the requests go.
func TestOneReportPerGatewayCarriesEveryWorker(t *testing.T) {
	mod := testenv.Module(t)
	var addrs, eps []string
	for range 4 {
		e := newServingEngine(t)
		addrs = append(addrs, e.addr())
		eps = append(eps, fmt.Sprintf(`{"address": %q}`, e.addr()))
	}
	type post struct {
		auth string
		rep  snapshot.GatewayReport
	}
	var mu sync.Mutex
	var posts []post
	var hold chan struct{} // set: the next report's answer waits for it to close
	held := make(chan struct{}, 1)
	quit := make(chan struct{}) // closed before front.Close: a held answer goes
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var rep snapshot.GatewayReport
		if err := json.NewDecoder(r.Body).Decode(&rep); err != nil || r.URL.Path != ReportsPath {
			http.Error(w, "bad report", http.StatusBadRequest)
			return
		}
		mu.Lock()
		posts = append(posts, post{r.Header.Get("Authorization"), rep})
		wait := hold
		hold = nil
		mu.Unlock()
		if wait != nil {
			held <- struct{}{}
			select {
			case <-wait:
			case <-quit:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(front.Close)
	t.Cleanup(func() { close(quit) })
	const workers, interval = 4, 300
	cfg := fmt.Sprintf(`{"endpoints": [%s], "state": {"token": "s3cret", "report": {"cluster": "metrics", "intervalMs": %d}}, "fallbacks": 0}`, strings.Join(eps, ","), interval)
	// From before the gateway starts: it may report (its load) before the
	// first request.
	start := time.Now()
	h, url := wasmhosttest.Start(t, wasmhost.Config{
		Module: mod, VMID: "kvroute", Workers: workers, Dispatch: wasmhost.DispatchStream,
		Filters:      []wasmhost.Filter{{RootID: "kvroute.router", Configuration: cfg, AllowOnHeadersStopIteration: true}},
		Clusters:     map[string][]string{"engines": addrs, "metrics": {front.Listener.Addr().String()}},
		RouteCluster: "engines",
	})
	routed := func() (n int, chains map[string]int) {
		mu.Lock()
		defer mu.Unlock()
		chains = map[string]int{}
		for _, p := range posts {
			for _, rt := range p.rep.Routes {
				chains[rt.Chain]++
				n++
			}
		}
		return n, chains
	}
	const rounds, perRound = 3, 2 * workers
	for k := range rounds {
		release := make(chan struct{})
		mu.Lock()
		hold = release
		mu.Unlock()
		for i := range perRound {
			prompt := fmt.Sprintf("Round %d request %d. ", k, i) + strings.Repeat("Answer briefly and cite the handbook. ", 40)
			resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":1}`, prompt)))
			if code := testenv.Drain(t, resp, err); code != 200 {
				t.Fatalf("status %d", code)
			}
		}
		select {
		case <-held: // a report, sent since the round began, waits for its answer
		case <-time.After(testenv.WaitTimeout):
			t.Fatalf("round %d: no report within %v", k, testenv.WaitTimeout)
		}
		h.FireTicks() // every worker flushes its routes to the ring
		close(release)
		testenv.WaitFor(t, fmt.Sprintf("round %d's routes reported", k), func() bool { n, _ := routed(); return n >= (k+1)*perRound })
	}
	for _, w := range h.Workers() {
		if w.Requests < rounds*perRound/workers {
			t.Fatalf("worker %d served %d requests, want %d: the test needs every worker routing", w.Index, w.Requests, rounds*perRound/workers)
		}
	}
	n, chains := routed()
	if n != rounds*perRound || len(chains) != rounds*perRound {
		t.Fatalf("reports carry %d routes of %d distinct chains, want each of %d routes once", n, len(chains), rounds*perRound)
	}
	mu.Lock()
	defer mu.Unlock()
	elapsed := time.Since(start) // after every report counted below arrived
	withRoutes, most := 0, 0
	for i, p := range posts {
		if p.auth != "Bearer s3cret" {
			t.Fatalf("report %d: authorization %q, want the state token", i, p.auth)
		}
		if i > 0 {
			prev := posts[i-1].rep
			if gap := p.rep.TimestampMs - prev.TimestampMs; gap < interval {
				t.Errorf("reports %d and %d are %d ms apart, want at least the %d ms interval", i-1, i, gap, interval)
			}
			if p.rep.Seq < prev.Seq || p.rep.Gateway != prev.Gateway {
				t.Errorf("report %d: gateway %s seq %d after gateway %s seq %d", i, p.rep.Gateway, p.rep.Seq, prev.Gateway, prev.Seq)
			}
		}
		if len(p.rep.Routes) > 0 {
			withRoutes++
		}
		most = max(most, len(p.rep.Routes))
	}
	t.Logf("%d reports in %v (%d with routes, at most %d routes in one) from %d workers", len(posts), elapsed, withRoutes, most, workers)
	if limit := int(elapsed/(interval*time.Millisecond)) + 1; len(posts) > limit {
		t.Errorf("%d reports in %v, want at most %d: one per %d ms interval per gateway", len(posts), elapsed, limit, interval)
	}
	if most <= perRound/workers {
		t.Errorf("no report carries more than %d routes: each worker reports on its own", most)
	}
}
