package filter

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/sim/server"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/v8host"
)

// needV8 skips a test when node is missing, except in CI, where .ci/run
// installs it and a missing node is a failure.
func needV8(t testing.TB) {
	t.Helper()
	if err := v8host.Available(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// seenUpstream is an upstream that records, per request, its own address
// and the headers it received.
type seenUpstream struct {
	mu   sync.Mutex
	seen []http.Header
	addr []string
}

func (u *seenUpstream) start(t testing.TB, n int) []string {
	var addrs []string
	for range n {
		var addr string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			u.mu.Lock()
			u.seen = append(u.seen, r.Header.Clone())
			u.addr = append(u.addr, addr)
			u.mu.Unlock()
			w.Header().Set("content-type", "application/json")
			io.WriteString(w, `{"id":"cmpl-1","choices":[{"text":"ok"}],"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":0}}}`)
		}))
		t.Cleanup(srv.Close)
		addr = srv.Listener.Addr().String()
		addrs = append(addrs, addr)
	}
	return addrs
}

func (u *seenUpstream) last() (string, http.Header) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.addr) == 0 {
		return "", nil
	}
	return u.addr[len(u.addr)-1], u.seen[len(u.seen)-1]
}

func startV8Router(t *testing.T, addrs []string, extra string) *v8host.Host {
	t.Helper()
	needV8(t)
	h, err := v8host.Start(v8host.Config{
		Module: testenv.ModulePath(t), RootID: RootRouter, Upstreams: addrs,
		Configuration: "{" + endpointsJSON(addrs) + extra + "}",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func v8Post(t *testing.T, url, body string, header http.Header) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("content-type", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestV8RoutesWithPrefixAffinity runs the module in V8 (Envoy's default
// engine): requests sharing a long system prompt are routed to one host once
// the index holds the prompt, the destination header the upstream sees names
// that host, client-supplied routing headers never arrive, and the module
// asked for nothing the host does not serve.
func TestV8RoutesWithPrefixAffinity(t *testing.T) {
	var up seenUpstream
	addrs := up.start(t, 16)
	h := startV8Router(t, addrs, "")
	system := strings.Repeat("You are the V8 conformance assistant; answer briefly. ", 150)
	hosts := map[string]int{}
	for i := range 12 {
		hdr := http.Header{"X-Gateway-Destination-Endpoint": {"10.9.9.9:1"}, "X-Kvroute-Prefill-Host": {"10.9.9.9:2"}}
		code, body := v8Post(t, h.Filtered+"/v1/chat/completions", chatBody(system, fmt.Sprintf("question %d", i)), hdr)
		if code != 200 {
			t.Fatalf("request %d: status %d: %s\n%s", i, code, body, h.Stderr())
		}
		addr, seen := up.last()
		dest := seen.Get("x-gateway-destination-endpoint")
		if first, _, _ := strings.Cut(dest, ","); first != addr {
			t.Fatalf("request %d reached %s, but its destination header says %q", i, addr, dest)
		}
		if strings.Contains(dest, "10.9.9.9") || seen.Get("x-kvroute-prefill-host") != "" {
			t.Fatalf("request %d: a client-supplied routing header reached the upstream: %v", i, seen)
		}
		if i > 0 {
			hosts[addr]++
		}
	}
	if len(hosts) != 1 {
		t.Errorf("requests sharing a system prompt went to %d hosts after the first (%v); want one", len(hosts), hosts)
	}
	// A prompt the index has not seen is free to go elsewhere, and a different
	// long prompt repeated sticks to its own host too.
	other := strings.Repeat("Translate the following passages into French, keeping names. ", 150)
	var firstOther string
	for i := range 4 {
		if code, body := v8Post(t, h.Filtered+"/v1/chat/completions", chatBody(other, fmt.Sprintf("passage %d", i)), nil); code != 200 {
			t.Fatalf("status %d: %s", code, body)
		}
		addr, _ := up.last()
		if i == 1 {
			firstOther = addr
		} else if i > 1 && addr != firstOther {
			t.Errorf("the second prompt moved from %s to %s", firstOther, addr)
		}
	}
	st, err := h.StatsWithSamples()
	if err != nil {
		t.Fatal(err)
	}
	if st.Traps != 0 || st.FailedVMs != 0 {
		t.Fatalf("traps %d, failed VMs %d: %v", st.Traps, st.FailedVMs, st.LastErrors)
	}
	if len(st.Unknown) != 0 {
		t.Errorf("the module asked for properties the V8 host does not serve: %v", st.Unknown)
	}
	if st.Logs["error"] != 0 || st.Logs["warn"] != 0 {
		t.Errorf("module logged warnings or errors: %v %v", st.Logs, st.LastErrors)
	}
	decisions := st.Metrics["kvroute.router.decision_us"]
	if decisions.Count != 16 || len(decisions.Samples) != 16 {
		t.Errorf("decision histogram has %d samples, want 16 (one per routed request)", decisions.Count)
	}
	// Headers and log once per request; a body at least twice, its bytes
	// and then its empty end, as Envoy's HTTP/1 codec delivers it.
	for name, want := range map[string]int{"request_headers": 16, "request_body": 32, "response_headers": 16, "response_body": 32, "log": 16} {
		if st.PerCallback[name] <= 0 {
			t.Errorf("no time recorded in proxy_on_%s", name)
		}
		if n := st.CallCount[name]; n < want || (n != want && !strings.HasSuffix(name, "_body")) {
			t.Errorf("proxy_on_%s ran %d times for 16 requests, want %d", name, n, want)
		}
	}
}

// TestV8BadInputAndPanics sends bad requests through the module in V8: each
// gets its documented status with an OpenAI-style body and reaches no
// upstream; a recovered panic fails open and is counted; a trap fails the
// VM, which then answers 503, as Envoy's fail-closed plugin does.
func TestV8BadInputAndPanics(t *testing.T) {
	var up seenUpstream
	addrs := up.start(t, 4)
	h := startV8Router(t, addrs, `,"testHooks":true,"maxBodyBytes":65536`)
	for _, c := range []struct {
		name, body string
		code       int
	}{
		{"truncated JSON", `{"model":"m","messages":[{"role":"user","content":"hi"`, 400},
		{"wrong type", `{"model":"m","prompt":42}`, 400},
		{"missing model", `{"prompt":"hello"}`, 400},
		{"invalid UTF-8", "{\"model\":\"m\",\"prompt\":\"\xff\xfe\"}", 400},
		{"oversized", `{"model":"m","prompt":"` + strings.Repeat("a", 70000) + `"}`, 413},
	} {
		code, body := v8Post(t, h.Filtered+"/v1/completions", c.body, nil)
		if code != c.code {
			t.Errorf("%s: status %d, want %d (%s)", c.name, code, c.code, body)
			continue
		}
		if !strings.Contains(body, `"error"`) || !strings.Contains(body, `"type"`) {
			t.Errorf("%s: body %q is not an OpenAI-style error", c.name, body)
		}
	}
	if addr, _ := up.last(); addr != "" {
		t.Errorf("a bad request reached upstream %s", addr)
	}
	req, _ := http.NewRequest("GET", h.Filtered+"/v1/completions", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Errorf("GET on an inference path: status %d, want 405", resp.StatusCode)
	}

	good := `{"model":"m","prompt":"` + strings.Repeat("hello world ", 100) + `"}`
	if code, body := v8Post(t, h.Filtered+"/v1/completions", good, http.Header{"X-Kvroute-Test-Panic": {"recover"}}); code != 200 {
		t.Fatalf("a recovered panic should fail open: status %d: %s", code, body)
	}
	st, err := h.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Traps != 0 || st.Metrics["kvroute.router.recovered_panics"].Value != 1 {
		t.Fatalf("after a recovered panic: traps %d, recovered_panics %v", st.Traps, st.Metrics["kvroute.router.recovered_panics"].Value)
	}
	if code, _ := v8Post(t, h.Filtered+"/v1/completions", good, nil); code != 200 {
		t.Fatalf("the VM should be healthy after a recovered panic: status %d", code)
	}
	v8Post(t, h.Filtered+"/v1/completions", good, http.Header{"X-Kvroute-Test-Panic": {"trap"}})
	if code, _ := v8Post(t, h.Filtered+"/v1/completions", good, nil); code != 503 {
		t.Errorf("after a trap the failed VM should answer 503, got %d", code)
	}
	if st, _ := h.Stats(); st.Traps != 1 || st.FailedVMs != 1 {
		t.Errorf("after a trap: traps %d, failed VMs %d", st.Traps, st.FailedVMs)
	}
}

// A configuration the router rejects fails the plugin's start in V8 too,
// and Start's error quotes the module's log line naming the field.
func TestV8PluginStartFailureNamesTheField(t *testing.T) {
	needV8(t)
	h, err := v8host.Start(v8host.Config{Module: testenv.ModulePath(t), RootID: RootRouter,
		Configuration: `{"endpoints":[{"address":"10.0.0.1:8000"},{"address":"not-an-address"}]}`})
	if err == nil {
		h.Close()
		t.Fatal("the plugin started with an invalid endpoint address")
	}
	if !strings.Contains(err.Error(), "endpoints[1].address") {
		t.Errorf("error %q should name endpoints[1].address", err)
	}
}

// v8Store reads the V8 host's shared data as an index.Store (read only).
type v8Store struct{ h *v8host.Host }

func (s v8Store) Get(key string) ([]byte, uint32, error) {
	v, cas, ok, err := s.h.SharedData(key)
	if err != nil {
		return nil, 0, err
	}
	if !ok {
		return nil, 0, index.ErrNotFound
	}
	return v, cas, nil
}

func (s v8Store) Set(string, []byte, uint32) error { return errors.New("read only") }

// TestV8LoadCountersSurviveResets is the counter-leak test in V8: streamed
// and whole responses from simulated engines, a third of the requests reset
// by the client at a random moment, two worker VMs; afterwards every
// shared load counter is zero and no VM trapped.
func TestV8LoadCountersSurviveResets(t *testing.T) {
	needV8(t)
	n := 3000
	if testing.Short() {
		n = 500
	}
	f := startFleet(t, server.Options{Replicas: 4, TimeScale: 0.002})
	h, err := v8host.Start(v8host.Config{Module: testenv.ModulePath(t), RootID: RootRouter, Upstreams: f.Addrs(), Workers: 2,
		Configuration: "{" + endpointsJSON(f.Addrs()) + `,"fallbacks":1}`})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	sendWithResets(t, h.Filtered, n)
	waitLoadsZero(t, v8Store{h})
	st, err := h.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Traps != 0 || st.Metrics["kvroute.router.recovered_panics"].Value != 0 {
		t.Errorf("traps %d, recovered panics %v: %v", st.Traps, st.Metrics["kvroute.router.recovered_panics"].Value, st.LastErrors)
	}
}
