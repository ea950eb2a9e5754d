package metricsvc

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvroute/kvroute/internal/metricsvc/discovery"
	"github.com/kvroute/kvroute/internal/metricsvc/kvevents"
	"github.com/kvroute/kvroute/internal/metricsvc/push"
	"github.com/kvroute/kvroute/internal/metricsvc/scrape"
	"github.com/kvroute/kvroute/internal/sim/server"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/snapshot"
)

// gateway is a state endpoint that checks the bearer token, like the
// router's, and keeps every snapshot it accepted.
type gateway struct {
	token  string
	status atomic.Int64 // forced answer when non-zero
	srv    *httptest.Server

	mu       sync.Mutex
	accepted []snapshot.State
	refused  int
}

func newGateway(t *testing.T, token string) *gateway {
	g := &gateway{token: token}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.URL.Path != "/.kvroute/v1/state" {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("Authorization") != "Bearer "+g.token {
			g.mu.Lock()
			g.refused++
			g.mu.Unlock()
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		if s := g.status.Load(); s != 0 {
			http.Error(w, "gateway trouble", int(s))
			return
		}
		var st snapshot.State
		if err := json.Unmarshal(body, &st); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		g.mu.Lock()
		g.accepted = append(g.accepted, st)
		g.mu.Unlock()
	}))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *gateway) url() string { return g.srv.URL + "/.kvroute/v1/state" }

func (g *gateway) latest() (snapshot.State, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.accepted) == 0 {
		return snapshot.State{}, 0
	}
	return g.accepted[len(g.accepted)-1], len(g.accepted)
}

func hostOf(st snapshot.State, addr string) (snapshot.Host, bool) {
	for _, h := range st.Hosts {
		if h.Address == addr {
			return h, true
		}
	}
	return snapshot.Host{}, false
}

// hostAt is the entry of addr's data-parallel rank (of addr itself for
// an engine without ranks and rank 0).
func hostAt(st snapshot.State, addr string, rank int) (snapshot.Host, bool) {
	for _, h := range st.Hosts {
		if h.Address == addr && h.Rank == rank {
			return h, true
		}
	}
	return snapshot.Host{}, false
}

// waitState waits until the gateway's latest snapshot satisfies cond.
func (g *gateway) waitState(t *testing.T, what string, d time.Duration, cond func(snapshot.State) bool) snapshot.State {
	t.Helper()
	var st snapshot.State
	if !testenv.Poll(d, func() bool {
		var n int
		st, n = g.latest()
		return n > 0 && cond(st)
	}) {
		t.Fatalf("timed out waiting for %s; latest snapshot: %+v", what, st)
	}
	return st
}

func startService(t *testing.T, cfg Config) (*Service, *testenv.LockedBuffer, string) {
	t.Helper()
	sink := &testenv.LockedBuffer{} // the service's logs, for assertions
	cfg.Log = slog.New(slog.NewTextHandler(sink, nil))
	if cfg.Name == "" {
		cfg.Name = "test"
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	admin := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		admin.Close()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	return s, sink, admin.URL
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metricValue finds one sample line's value in a Prometheus exposition.
func metricValue(text, series string) (float64, bool) {
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			var v float64
			fmt.Sscanf(rest, "%g", &v)
			return v, true
		}
	}
	return 0, false
}

// TestLiveEnginesKillAndRestart scrapes live simulated vLLM engines
// (internal/sim/server) over real HTTP, kills one, and brings it back on
// the same port.
func TestLiveEnginesKillAndRestart(t *testing.T) {
	fleet, err := server.Start(server.Options{Replicas: 2, TimeScale: 1, KVBlocks: 4096})
	if err != nil {
		t.Fatal(err)
	}
	// Engine b is closed mid-test (a new server later takes its port);
	// Server.Close is idempotent, so closing the whole fleet at the end is
	// safe.
	defer fleet.Close()
	a, b := fleet.Servers[0].Addr, fleet.Servers[1].Addr
	gw := newGateway(t, "s3cret")
	const interval = 100 * time.Millisecond
	_, logs, admin := startService(t, Config{
		Source:         discovery.Fixed{{Address: a, Role: "prefill"}, {Address: b}},
		ScrapeInterval: interval,
		Gateways:       []string{gw.url()},
		Token:          push.StaticToken("s3cret"),
		PushInterval:   500 * time.Millisecond,
	})

	st := gw.waitState(t, "both engines healthy", 5*time.Second, func(st snapshot.State) bool {
		ha, _ := hostOf(st, a)
		hb, _ := hostOf(st, b)
		return ha.Healthy && hb.Healthy
	})
	ha, _ := hostOf(st, a)
	prof := fleet.Servers[0].Profile()
	if ha.Model != "llama-3-8b" || ha.Role != "prefill" || ha.BlockSize != prof.BlockSize || ha.NumGPUBlocks != 4096 || ha.ScrapedAtMs == 0 {
		t.Errorf("host a = %+v (profile block size %d)", ha, prof.BlockSize)
	}
	if st.Version != snapshot.Version || st.Source != "test" || st.TimestampMs == 0 {
		t.Errorf("snapshot header = %+v", st)
	}

	// Load on engine a shows up as running requests.
	ctx, cancelLoad := context.WithCancel(context.Background())
	var loadWG sync.WaitGroup
	for i := range 3 {
		loadWG.Add(1)
		go func() {
			defer loadWG.Done()
			body := fmt.Sprintf(`{"model":"llama-3-8b","prompt":"request %d %s","max_tokens":2000}`, i, strings.Repeat("x", 200))
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+a+"/v1/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	gw.waitState(t, "running requests on a", 5*time.Second, func(st snapshot.State) bool {
		h, _ := hostOf(st, a)
		return h.Running+h.Waiting >= 3
	})
	cancelLoad()
	loadWG.Wait()

	// Kill b: unhealthy within two intervals (plus scheduling slack on a
	// shared machine), a unaffected.
	killed := time.Now()
	if err := fleet.Servers[1].Close(); err != nil {
		t.Fatal(err)
	}
	st = gw.waitState(t, "b unhealthy", 2*time.Second, func(st snapshot.State) bool {
		h, _ := hostOf(st, b)
		return !h.Healthy
	})
	took := time.Since(killed)
	t.Logf("killed engine marked unhealthy at the gateway after %v (interval %v)", took, interval)
	// The rule is pinned by TestHealthRule; here a loaded shared machine
	// gets generous slack for goroutine scheduling and the push itself.
	if took > 2*interval+500*time.Millisecond {
		t.Errorf("unhealthy after %v, want within two intervals (%v) plus slack", took, 2*interval)
	}
	if h, _ := hostOf(st, a); !h.Healthy {
		t.Errorf("a went unhealthy with b")
	}

	// Restart b on the same port.
	port := b[strings.LastIndexByte(b, ':')+1:]
	var p int
	fmt.Sscanf(port, "%d", &p)
	var again *server.Fleet
	deadline := time.Now().Add(5 * time.Second)
	for {
		again, err = server.Start(server.Options{Replicas: 1, PortBase: p, TimeScale: 1, KVBlocks: 4096})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("restart on port %d: %v", p, err)
	}
	defer again.Close()
	back := time.Now()
	gw.waitState(t, "b healthy again", 3*time.Second, func(st snapshot.State) bool {
		h, _ := hostOf(st, b)
		return h.Healthy
	})
	t.Logf("restarted engine healthy at the gateway after %v", time.Since(back))

	out := logs.String()
	for _, want := range []string{"marked unhealthy", "answers; healthy"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	code, text := get(t, admin+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	if v, ok := metricValue(text, fmt.Sprintf(`kvroute_metrics_scrapes_total{host=%q,result="connect"}`, b)); !ok || v < 1 {
		t.Errorf("connect failures for b not counted (%v, %v)", v, ok)
	}
	if v, _ := metricValue(text, fmt.Sprintf(`kvroute_metrics_scrapes_total{host=%q,result="ok"}`, a)); v < 2 {
		t.Errorf("ok scrapes of a = %v", v)
	}
	code, text = get(t, admin+"/healthz")
	if code != 200 || !strings.Contains(text, `"status":"ok"`) || !strings.Contains(text, `"healthyHosts":2`) {
		t.Errorf("/healthz = %d %s", code, text)
	}
}

// fakeEngine serves whatever metrics text it is told to.
type fakeEngine struct {
	text    atomic.Value
	scrapes atomic.Int64 // metrics pages served
	srv     *httptest.Server
}

func newFakeEngine(t *testing.T, text string) *fakeEngine {
	e := &fakeEngine{}
	e.text.Store(text)
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		io.WriteString(w, e.text.Load().(string))
		e.scrapes.Add(1)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *fakeEngine) addr() string { return e.srv.Listener.Addr().String() }

func vllmText(waiting, running int) string {
	return fmt.Sprintf(`# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} %d
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} %d
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.5
`, waiting, running)
}

// TestBadInputIsolated: malformed metrics, an unknown metric type, an SGLang
// engine, a gateway answering 500 and one with another token, all at once.
// Each problem is logged and counted, nothing crashes, and the healthy
// engine and gateway are unaffected.
func TestBadInputIsolated(t *testing.T) {
	good := newFakeEngine(t, vllmText(2, 1))
	malformed := newFakeEngine(t, "vllm:num_requests_waiting{model_name=\"m\" 3\n")
	unknownType := newFakeEngine(t, "# TYPE vllm:num_requests_waiting exotic\nvllm:num_requests_waiting 3\n")
	unrelatedUnknown := newFakeEngine(t, "# TYPE python_info strange\npython_info 1\n"+vllmText(4, 0))
	sgl := newFakeEngine(t, "sglang:num_queue_reqs{model_name=\"q\"} 5\nsglang:num_running_reqs{model_name=\"q\"} 1\nsglang:token_usage{model_name=\"q\"} 0.25\n")
	gw := newGateway(t, "tok")
	gw500 := newGateway(t, "tok")
	gw500.status.Store(500)
	gwOther := newGateway(t, "a-different-token")

	_, logs, admin := startService(t, Config{
		Source: discovery.Fixed{{Address: good.addr()}, {Address: malformed.addr()}, {Address: unknownType.addr()},
			{Address: unrelatedUnknown.addr()}, {Address: sgl.addr()}},
		ScrapeInterval: 50 * time.Millisecond,
		ScrapeTimeout:  time.Second, // no health flaps on a loaded machine
		Gateways:       []string{gw500.url(), gwOther.url(), gw.url()},
		Token:          push.StaticToken("tok"),
	})
	st := gw.waitState(t, "good engines healthy", 5*time.Second, func(st snapshot.State) bool {
		h1, _ := hostOf(st, good.addr())
		h2, _ := hostOf(st, unrelatedUnknown.addr())
		h3, _ := hostOf(st, sgl.addr())
		return h1.Healthy && h2.Healthy && h3.Healthy
	})
	if h, _ := hostOf(st, good.addr()); h.Waiting != 2 || h.Running != 1 || h.KVUsage != 0.5 || h.Model != "m" {
		t.Errorf("good engine = %+v", h)
	}
	if h, _ := hostOf(st, unrelatedUnknown.addr()); h.Waiting != 4 {
		t.Errorf("engine with an unrelated unknown type = %+v", h)
	}
	if h, _ := hostOf(st, sgl.addr()); h.Waiting != 5 || h.Running != 1 || h.KVUsage != 0.25 || h.Model != "q" {
		t.Errorf("sglang engine = %+v", h)
	}
	for _, bad := range []string{malformed.addr(), unknownType.addr()} {
		if h, ok := hostOf(st, bad); !ok || h.Healthy {
			t.Errorf("bad engine %s = %+v (present %v), want present and unhealthy", bad, h, ok)
		}
	}
	// Changes still flow to the good gateway while the others fail.
	good.text.Store(vllmText(9, 1))
	gw.waitState(t, "new queue", 3*time.Second, func(st snapshot.State) bool {
		h, _ := hostOf(st, good.addr())
		return h.Waiting == 9
	})
	// Let the failing gateways retry a few times.
	var text string
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, text = get(t, admin+"/metrics")
		a, _ := metricValue(text, fmt.Sprintf(`kvroute_metrics_pushes_total{gateway=%q,result="status"}`, gw500.url()))
		b, _ := metricValue(text, fmt.Sprintf(`kvroute_metrics_pushes_total{gateway=%q,result="unauthorized"}`, gwOther.url()))
		if (a >= 2 && b >= 2) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	checks := map[string]float64{
		fmt.Sprintf(`kvroute_metrics_scrapes_total{host=%q,result="parse"}`, malformed.addr()):       2,
		fmt.Sprintf(`kvroute_metrics_scrapes_total{host=%q,result="parse"}`, unknownType.addr()):     2,
		fmt.Sprintf(`kvroute_metrics_pushes_total{gateway=%q,result="status"}`, gw500.url()):         2,
		fmt.Sprintf(`kvroute_metrics_pushes_total{gateway=%q,result="unauthorized"}`, gwOther.url()): 2,
		fmt.Sprintf(`kvroute_metrics_pushes_total{gateway=%q,result="ok"}`, gw.url()):                2,
	}
	for series, min := range checks {
		if v, ok := metricValue(text, series); !ok || v < min {
			t.Errorf("%s = %v (present %v), want >= %v", series, v, ok, min)
		}
	}
	if v, _ := metricValue(text, fmt.Sprintf(`kvroute_metrics_pushes_total{gateway=%q,result="ok"}`, gwOther.url())); v != 0 {
		t.Errorf("the gateway with another token accepted %v pushes", v)
	}
	if _, n := gwOther.latest(); n != 0 {
		t.Errorf("wrong-token gateway stored %d snapshots", n)
	}
	out := logs.String()
	for _, want := range []string{"state push failed", "reason=status", "reason=unauthorized", "unknown metric type", "engine scrape failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q", want)
		}
	}
}

// zmqPublisher is a vLLM-style KV event publisher in the test process.
type zmqPublisher struct {
	sock  zmq4.Socket
	ep    string
	topic string // sent as the first frame (vLLM sends an empty one)
}

func newZMQPublisher(t *testing.T) *zmqPublisher {
	pub := zmq4.NewPub(context.Background())
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return &zmqPublisher{sock: pub, ep: "tcp://" + pub.Addr().String()}
}

func (p *zmqPublisher) send(t *testing.T, seq uint64, payload []byte) {
	t.Helper()
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	if err := p.sock.Send(zmq4.NewMsgFrom([]byte(p.topic), s[:], payload)); err != nil {
		t.Fatal(err)
	}
}

// batch encodes an EventBatch in the array layout (tagged arrays) or the
// map layout ("type" keys). stored and removed are block hashes.
func batch(t *testing.T, mapLayout bool, stored, removed []uint64, clear bool) []byte {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	n := 0
	if len(stored) > 0 {
		n++
	}
	if len(removed) > 0 {
		n++
	}
	if clear {
		n++
	}
	check := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	if mapLayout {
		check(e.EncodeMapLen(2))
		check(e.EncodeString("ts"))
		check(e.EncodeFloat64(1))
		check(e.EncodeString("events"))
	} else {
		check(e.EncodeArrayLen(2))
		check(e.EncodeFloat64(1))
	}
	check(e.EncodeArrayLen(n))
	if len(stored) > 0 {
		if mapLayout {
			check(e.Encode(map[string]any{"type": "BlockStored", "block_hashes": stored, "parent_block_hash": nil,
				"token_ids": []int{1, 2}, "block_size": 16, "lora_id": nil, "medium": "GPU"}))
		} else {
			check(e.Encode([]any{"BlockStored", stored, nil, []int{1, 2}, 16, nil, "GPU"}))
		}
	}
	if len(removed) > 0 {
		if mapLayout {
			check(e.Encode(map[string]any{"type": "BlockRemoved", "block_hashes": removed, "medium": nil}))
		} else {
			check(e.Encode([]any{"BlockRemoved", removed, nil}))
		}
	}
	if clear {
		if mapLayout {
			check(e.Encode(map[string]any{"type": "AllBlocksCleared"}))
		} else {
			check(e.Encode([]any{"AllBlocksCleared"}))
		}
	}
	return buf.Bytes()
}

// TestKVEventsInSnapshot: a real ZMQ publisher emits both layouts, garbage
// and a sequence gap; the snapshot carries the cached block count and the
// clear, and the counters say what happened.
func TestKVEventsInSnapshot(t *testing.T) {
	eng := newFakeEngine(t, vllmText(0, 0))
	pub := newZMQPublisher(t)
	gw := newGateway(t, "tok")
	_, logs, admin := startService(t, Config{
		Source:         discovery.Fixed{{Address: eng.addr(), KVEvents: pub.ep}},
		ScrapeInterval: 50 * time.Millisecond,
		ScrapeTimeout:  time.Second, // no health flaps on a loaded machine
		Gateways:       []string{gw.url()},
		Token:          push.StaticToken("tok"),
	})
	// Wait for the subscription (ZMQ drops messages sent before it).
	deadline := time.Now().Add(10 * time.Second)
	for len(pub.sock.(zmq4.Topics).Topics()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the service never subscribed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	pub.send(t, 0, batch(t, false, []uint64{1, 2, 3, 4}, nil, false))
	pub.send(t, 1, batch(t, true, []uint64{5}, []uint64{1}, false))
	gw.waitState(t, "4 cached blocks", 5*time.Second, func(st snapshot.State) bool {
		h, _ := hostOf(st, eng.addr())
		return h.CachedBlocks == 4 && h.Healthy
	})
	pub.send(t, 2, []byte{0xc1, 0xff, 0x00}) // garbage msgpack
	pub.send(t, 6, batch(t, false, []uint64{6}, nil, false))
	gw.waitState(t, "5 cached blocks after the gap", 5*time.Second, func(st snapshot.State) bool {
		h, _ := hostOf(st, eng.addr())
		return h.CachedBlocks == 5
	})
	before := time.Now().UnixMilli()
	pub.send(t, 7, batch(t, true, nil, nil, true))
	st := gw.waitState(t, "clear", 5*time.Second, func(st snapshot.State) bool {
		h, _ := hostOf(st, eng.addr())
		return h.CachedBlocks == 0 && h.ClearedAtMs >= before
	})
	if h, _ := hostOf(st, eng.addr()); !h.Healthy {
		t.Errorf("host unhealthy: %+v", h)
	}
	_, text := get(t, admin+"/metrics")
	for kind, want := range map[string]float64{"batches": 4, "gaps": 1, "missed_batches": 3, "decode_errors": 1, "clears": 1} {
		series := fmt.Sprintf(`kvroute_metrics_kv_events_total{host=%q,kind=%q}`, eng.addr(), kind)
		if v, ok := metricValue(text, series); !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", series, v, ok, want)
		}
	}
	if v, _ := metricValue(text, fmt.Sprintf(`kvroute_metrics_kv_events_connected{host=%q}`, eng.addr())); v != 1 {
		t.Errorf("kv_events_connected = %v", v)
	}
	out := logs.String()
	for _, want := range []string{"sequence gap", "missed=3", "KV event batch dropped"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q", want)
		}
	}
}

// contentOf is what the "changed" decision compares: the hosts without
// their scrape timestamps.
func contentOf(st snapshot.State) string {
	hs := slices.Clone(st.Hosts)
	for i := range hs {
		hs[i].ScrapedAtMs = 0
	}
	b, _ := json.Marshal(hs)
	return string(b)
}

// TestPushOnChange: with a long push interval, a change goes out at once
// (well before the interval could explain it), and no snapshot is pushed
// twice with the same content.
func TestPushOnChange(t *testing.T) {
	eng := newFakeEngine(t, vllmText(1, 1))
	gw := newGateway(t, "tok")
	const pushEvery = 10 * time.Second
	startService(t, Config{
		Source:         discovery.Fixed{{Address: eng.addr()}},
		ScrapeInterval: 50 * time.Millisecond,
		ScrapeTimeout:  time.Second, // no health flaps on a loaded machine
		Gateways:       []string{gw.url()},
		Token:          push.StaticToken("tok"),
		PushInterval:   pushEvery,
	})
	gw.waitState(t, "first", testenv.WaitTimeout, func(st snapshot.State) bool { h, _ := hostOf(st, eng.addr()); return h.Healthy })
	from := eng.scrapes.Load()
	testenv.WaitFor(t, "ten scrapes of the unchanged engine", func() bool { return eng.scrapes.Load() >= from+10 })
	changed := time.Now()
	eng.text.Store(vllmText(7, 1))
	gw.waitState(t, "change", pushEvery/2, func(st snapshot.State) bool { h, _ := hostOf(st, eng.addr()); return h.Waiting == 7 })
	t.Logf("a queue change reached the gateway %v after the engine changed (scrape interval 50 ms)", time.Since(changed))
	gw.mu.Lock()
	defer gw.mu.Unlock()
	for i := 1; i < len(gw.accepted); i++ {
		if contentOf(gw.accepted[i]) == contentOf(gw.accepted[i-1]) {
			t.Errorf("push %d repeats push %d's content within the push interval", i, i-1)
		}
	}
}

// TestPushHeartbeat: an unchanged fleet is still pushed once per push
// interval, with a fresh timestamp, so gateways can tell a live service
// from a dead one; and never sooner than the interval without a change.
func TestPushHeartbeat(t *testing.T) {
	eng := newFakeEngine(t, vllmText(1, 1))
	gw := newGateway(t, "tok")
	const pushEvery = 200 * time.Millisecond
	startService(t, Config{
		Source:         discovery.Fixed{{Address: eng.addr()}},
		ScrapeInterval: 50 * time.Millisecond,
		ScrapeTimeout:  time.Second, // no health flaps on a loaded machine
		Gateways:       []string{gw.url()},
		Token:          push.StaticToken("tok"),
		PushInterval:   pushEvery,
	})
	gw.waitState(t, "first", testenv.WaitTimeout, func(st snapshot.State) bool { h, _ := hostOf(st, eng.addr()); return h.Healthy })
	from := eng.scrapes.Load()
	// heartbeats are the pushes that repeat the content of the one before
	// (the others are changes: a health flap on a loaded machine, say).
	heartbeats := func() []int {
		gw.mu.Lock()
		defer gw.mu.Unlock()
		var hb []int
		for i := 1; i < len(gw.accepted); i++ {
			if contentOf(gw.accepted[i-1]) == contentOf(gw.accepted[i]) {
				hb = append(hb, i)
			}
		}
		return hb
	}
	testenv.WaitFor(t, "three heartbeats", func() bool { return len(heartbeats()) >= 3 })
	scrapes := eng.scrapes.Load() - from
	hb := heartbeats()
	gw.mu.Lock()
	defer gw.mu.Unlock()
	for _, i := range hb {
		if gap := gw.accepted[i].TimestampMs - gw.accepted[i-1].TimestampMs; gap < pushEvery.Milliseconds() {
			t.Errorf("unchanged snapshot re-pushed after %d ms, push interval %v", gap, pushEvery)
		}
	}
	// About one push per four scrapes: a fleet scraped n times is not
	// pushed n times.
	if pushes := int64(len(gw.accepted)) - 1; pushes >= scrapes {
		t.Errorf("%d pushes after the first for %d scrapes (%d heartbeats)", pushes, scrapes, len(hb))
	}
}

// TestHealthRule pins the rule itself: healthy while the last scrape
// succeeded and is at most two intervals old.
func TestHealthRule(t *testing.T) {
	s, err := New(Config{Source: discovery.Fixed{}, ScrapeInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	h := &host{attempted: true, lastOK: t0}
	for _, c := range []struct {
		after   time.Duration
		failing bool
		want    bool
	}{
		// two intervals = 200 ms
		{0, false, true}, {150 * time.Millisecond, false, true}, {200 * time.Millisecond, false, true},
		{201 * time.Millisecond, false, false}, {50 * time.Millisecond, true, false},
	} {
		h.failing = c.failing
		if got := s.healthy(h, t0.Add(c.after)); got != c.want {
			t.Errorf("%v after the last good scrape (failing %v): healthy=%v, want %v", c.after, c.failing, got, c.want)
		}
	}
	if s.healthy(&host{}, t0) || s.healthy(&host{attempted: true, failing: true}, t0) {
		t.Error("a never-scraped host is healthy")
	}
}

func TestDiscoveryChangesAndHealthz(t *testing.T) {
	e1 := newFakeEngine(t, vllmText(1, 0))
	e2 := newFakeEngine(t, vllmText(2, 0))
	gw := newGateway(t, "tok")
	src := &switchSource{ch: make(chan []discovery.Endpoint, 4)}
	s, _, admin := startService(t, Config{
		Source:         src,
		ScrapeInterval: 20 * time.Millisecond,
		ScrapeTimeout:  time.Second, // no health flaps on a loaded machine
		Gateways:       []string{gw.url()},
		Token:          push.StaticToken("tok"),
	})
	if code, body := get(t, admin+"/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "starting") {
		t.Errorf("/healthz before discovery = %d %s", code, body)
	}
	// Three passes of the snapshot loop, each of which would have
	// published a snapshot had it one to publish.
	lastTick := func() time.Time {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.lastTick
	}
	for range 3 {
		at := lastTick()
		testenv.WaitFor(t, "a pass of the snapshot loop", func() bool { return !lastTick().Equal(at) })
	}
	s.mu.Lock()
	published := !s.lastPub.IsZero()
	s.mu.Unlock()
	if _, n := gw.latest(); n != 0 || published {
		t.Errorf("%d snapshots pushed (published: %v) before discovery produced a set (an empty one takes every candidate away)", n, published)
	}
	src.ch <- []discovery.Endpoint{{Address: e1.addr(), Role: "decode"}}
	gw.waitState(t, "e1", 3*time.Second, func(st snapshot.State) bool { return len(st.Hosts) == 1 && st.Hosts[0].Healthy })
	src.ch <- []discovery.Endpoint{{Address: e2.addr()}, {Address: e1.addr(), Role: "prefill", Adapters: []string{"x"}}}
	st := gw.waitState(t, "e1+e2", 3*time.Second, func(st snapshot.State) bool {
		h1, _ := hostOf(st, e1.addr())
		h2, _ := hostOf(st, e2.addr())
		return h1.Role == "prefill" && h2.Healthy
	})
	if h, _ := hostOf(st, e1.addr()); len(h.Adapters) != 1 || h.Adapters[0] != "x" {
		t.Errorf("e1 = %+v", h)
	}
	src.ch <- []discovery.Endpoint{{Address: e2.addr()}}
	gw.waitState(t, "e1 gone", 3*time.Second, func(st snapshot.State) bool { return len(st.Hosts) == 1 && st.Hosts[0].Address == e2.addr() })
	if code, body := get(t, admin+"/healthz"); code != 200 {
		t.Errorf("/healthz = %d %s", code, body)
	}
	if code, body := get(t, admin+"/state"); code != 200 || !strings.Contains(body, e2.addr()) {
		t.Errorf("/state = %d %s", code, body)
	}
	if got := s.Snapshot(); len(got.Hosts) != 1 {
		t.Errorf("Snapshot() = %+v", got)
	}
}

// switchSource hands the service whatever sets the test sends.
type switchSource struct{ ch chan []discovery.Endpoint }

func (s *switchSource) Name() string { return "test" }

func (s *switchSource) Run(ctx context.Context, update func([]discovery.Endpoint)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case eps := <-s.ch:
			update(eps)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "discovery") {
		t.Errorf("no source: %v", err)
	}
	if _, err := New(Config{Source: discovery.Fixed{}, Gateways: []string{"http://x/.kvroute/v1/state"}}); err == nil || !strings.Contains(err.Error(), "token") {
		t.Errorf("no token: %v", err)
	}
	if _, err := New(Config{Source: discovery.Fixed{}, Gateways: []string{"http://x/.kvroute/v1/state"}, Token: push.StaticToken("")}); err == nil {
		t.Error("empty token accepted")
	}
	s, err := New(Config{Source: discovery.Fixed{{Address: "nope"}}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.Run(ctx); err == nil || !strings.Contains(err.Error(), "host:port") {
		t.Errorf("bad endpoint: %v", err)
	}
}

var _ = net.JoinHostPort

// TestHungEngine: an engine that still accepts connections but stops
// answering is caught by the scrape timeout: unhealthy within two
// intervals, healthy again when it answers.
func TestHungEngine(t *testing.T) {
	var hung atomic.Bool
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hung.Load() {
			select {
			case <-r.Context().Done():
			case <-release:
			}
			return
		}
		io.WriteString(w, vllmText(1, 1))
	}))
	defer srv.Close()
	defer close(release)
	addr := srv.Listener.Addr().String()
	gw := newGateway(t, "tok")
	const interval = 100 * time.Millisecond
	startService(t, Config{
		Source:         discovery.Fixed{{Address: addr}},
		ScrapeInterval: interval,
		Gateways:       []string{gw.url()},
		Token:          push.StaticToken("tok"),
	})
	gw.waitState(t, "healthy", 3*time.Second, func(st snapshot.State) bool { h, _ := hostOf(st, addr); return h.Healthy })
	silent := time.Now()
	hung.Store(true)
	gw.waitState(t, "unhealthy", 3*time.Second, func(st snapshot.State) bool { h, _ := hostOf(st, addr); return !h.Healthy })
	took := time.Since(silent)
	t.Logf("hung engine marked unhealthy at the gateway after %v (interval %v, default timeout 80%%)", took, interval)
	if took > 2*interval+500*time.Millisecond {
		t.Errorf("unhealthy after %v, want within two intervals plus slack", took)
	}
	hung.Store(false)
	gw.waitState(t, "healthy again", 3*time.Second, func(st snapshot.State) bool { h, _ := hostOf(st, addr); return h.Healthy })
}

// TestSameContentCoversEveryField changes each field of snapshot.Host in
// turn: all but ScrapedAtMs must count as a change, so a field added to the
// contract later is pushed on change rather than only with the heartbeat.
func TestSameContentCoversEveryField(t *testing.T) {
	base := snapshot.Host{Address: "a:1", Role: "decode", Model: "m", Adapters: []string{"x"}, Healthy: true,
		Waiting: 1, Running: 1, KVUsage: 0.5, BlockSize: 16, NumGPUBlocks: 10, CachedBlocks: 3, ClearedAtMs: 5, ScrapedAtMs: 7}
	typ := reflect.TypeOf(base)
	for i := range typ.NumField() {
		h := base
		h.Adapters = slices.Clone(base.Adapters)
		f := reflect.ValueOf(&h).Elem().Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString(f.String() + "!")
		case reflect.Bool:
			f.SetBool(!f.Bool())
		case reflect.Int, reflect.Int64:
			f.SetInt(f.Int() + 1)
		case reflect.Float64:
			f.SetFloat(f.Float() + 0.25)
		case reflect.Slice:
			f.Set(reflect.Append(f, reflect.ValueOf("y")))
		default:
			t.Fatalf("field %s has kind %s: teach this test and sameContent about it", typ.Field(i).Name, f.Kind())
		}
		same := sameContent([]snapshot.Host{base}, []snapshot.Host{h})
		if want := typ.Field(i).Name == "ScrapedAtMs"; same != want {
			t.Errorf("changing %s: sameContent = %v, want %v", typ.Field(i).Name, same, want)
		}
	}
}

// TestKVEventsListenMode: an engine publishing the llm-d way connects out
// to the service's bound socket under kv@<pod-ip>@<model>; its batches
// reach that engine's cached block count in the pushed snapshot, and a
// topic naming no discovered engine changes nothing.
func TestKVEventsListenMode(t *testing.T) {
	eng := newFakeEngine(t, vllmText(0, 0))
	gw := newGateway(t, "tok")
	svc, _, admin := startService(t, Config{
		Source:         discovery.Fixed{{Address: eng.addr(), Model: "m"}},
		ScrapeInterval: 50 * time.Millisecond,
		ScrapeTimeout:  time.Second,
		Gateways:       []string{gw.url()},
		Token:          push.StaticToken("tok"),
		KVEventsListen: "tcp://127.0.0.1:0",
	})
	ip, _, _ := net.SplitHostPort(eng.addr())
	pub := dialListener(t, svc)
	topic := "kv@" + ip + "@m"
	enc := kvevents.Encoder{Layout: kvevents.ArrayLayout}
	enc.Stored(kvevents.StoredEvent{Hashes: []uint64{1, 2, 3}, BlockSize: 16, Tokens: 48})
	payload := bytes.Clone(enc.Batch(1))
	// The subscription reaches a connecting publisher a moment after it
	// connects: resend the first batch (same seq) until it counts.
	gw.waitState(t, "3 cached blocks", 10*time.Second, func(st snapshot.State) bool {
		pub.Send(zmq4.NewMsgFrom(kvevents.Frames("kv@10.255.255.1@m", 0, payload)...))
		pub.Send(zmq4.NewMsgFrom(kvevents.Frames(topic, 0, payload)...))
		h, _ := hostOf(st, eng.addr())
		return h.CachedBlocks == 3
	})
	_, text := get(t, admin+"/metrics")
	if v, _ := metricValue(text, `kvroute_metrics_kv_events_listener_messages_total{kind="unrouted"}`); v == 0 {
		t.Error("the unknown engine's batches were not counted as unrouted")
	}
	if v, _ := metricValue(text, fmt.Sprintf(`kvroute_metrics_kv_events_connected{host=%q}`, eng.addr())); v != 1 {
		t.Errorf("kv_events_connected = %v for an engine publishing to the listener, want 1", v)
	}
}

// A host's adapter slots come from its scrape alone: adapters discovery
// declares join the list the gateways match against but take no slot.
func TestHostSnapshotAdapterSlots(t *testing.T) {
	s := &Service{}
	h := &host{
		ep:     discovery.Endpoint{Address: "10.0.0.1:8000", Adapters: []string{"declared"}},
		sample: scrape.Sample{Adapters: []string{"fin", "legal"}, MaxAdapters: 2},
	}
	got := s.hostSnapshot(h, time.Now())
	if !slices.Equal(got.Adapters, []string{"declared", "fin", "legal"}) || got.MaxAdapters != 2 || got.AdapterSlotsUsed != 2 {
		t.Errorf("snapshot = adapters %v, %d of %d slots; want [declared fin legal], 2 of 2", got.Adapters, got.AdapterSlotsUsed, got.MaxAdapters)
	}
	h.sample = scrape.Sample{} // no LoRA metrics: capacity unknown, nothing full
	if got = s.hostSnapshot(h, time.Now()); got.MaxAdapters != 0 || got.AdapterSlotsUsed != 0 {
		t.Errorf("without LoRA metrics: %d of %d slots, want 0 of 0", got.AdapterSlotsUsed, got.MaxAdapters)
	}
}

// An engine with several data-parallel ranks is pushed as one host entry
// per rank, each with its own queue.
func TestAppendRanksOneEntryPerRank(t *testing.T) {
	h := snapshot.Host{Address: "10.0.0.1:8000", Healthy: true, Waiting: 8}
	// Each rank's KV events are its own: rank 1 reported 2 blocks and a
	// clear, rank 0 one block.
	events := []*rankEvents{newRankEvents(time.Now), newRankEvents(time.Now)}
	now := time.Now()
	events[0].tracker.Apply(0, kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: []kvevents.BlockHash{kvevents.IntHash(1)}}}}, now)
	events[1].tracker.Apply(0, kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.AllBlocksCleared},
		{Kind: kvevents.BlockStored, Hashes: []kvevents.BlockHash{kvevents.IntHash(1), kvevents.IntHash(2)}}}}, now)
	got := appendRanks(nil, h, []scrape.Rank{{Waiting: 7, Running: 2, KVUsage: 0.5}, {Waiting: 1}}, events)
	if len(got) != 2 || got[0].Rank != 0 || got[1].Rank != 1 || got[1].DataParallelSize != 2 ||
		got[0].Waiting != 7 || got[1].Waiting != 1 || got[0].KVUsage != 0.5 || got[1].Address != h.Address || !got[1].Healthy {
		t.Errorf("ranks pushed as %+v", got)
	}
	if len(got) == 2 && (got[0].CachedBlocks != 1 || got[0].ClearedAtMs != 0 || got[1].CachedBlocks != 2 || got[1].ClearedAtMs != now.UnixMilli()) {
		t.Errorf("ranks' KV events pushed as rank 0 %d blocks cleared at %d, rank 1 %d blocks cleared at %d; want 1, 0, 2, %d",
			got[0].CachedBlocks, got[0].ClearedAtMs, got[1].CachedBlocks, got[1].ClearedAtMs, now.UnixMilli())
	}
	if got := appendRanks(nil, h, nil, events[:1]); len(got) != 1 || got[0].DataParallelSize != 0 || got[0].CachedBlocks != 1 {
		t.Errorf("an engine without ranks pushed as %+v", got)
	}
}

// dialListener waits (up to 10 s) until svc listens for engines' KV events
// and returns a publisher connected to it, as an engine that connects out
// (llm-d's way) has; it is closed when the test ends.
func dialListener(t *testing.T, svc *Service) zmq4.Socket {
	t.Helper()
	listener := func() *kvevents.Listener {
		svc.mu.Lock()
		defer svc.mu.Unlock()
		return svc.listener
	}
	for deadline := time.Now().Add(10 * time.Second); listener() == nil || listener().Addr() == ""; {
		if time.Now().After(deadline) {
			t.Fatal("the service never listened")
		}
		time.Sleep(5 * time.Millisecond)
	}
	pub := zmq4.NewPub(context.Background())
	t.Cleanup(func() { pub.Close() })
	if err := pub.Dial(listener().Addr()); err != nil {
		t.Fatal(err)
	}
	return pub
}
