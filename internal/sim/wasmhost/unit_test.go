package wasmhost

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"reflect"
	"sync"
	"testing"
)

func TestPairsRoundTripAndWireFormat(t *testing.T) {
	pairs := []Pair{{":path", "/v1/completions"}, {"x-a", ""}, {"k", "v"}}
	b := encodePairs(pairs)
	if n := binary.LittleEndian.Uint32(b); n != 3 {
		t.Fatalf("count %d", n)
	}
	if kl, vl := binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint32(b[8:]); kl != 5 || vl != 15 {
		t.Errorf("first lengths %d,%d", kl, vl)
	}
	data := b[4+8*3:]
	if !bytes.HasPrefix(data, []byte(":path\x00/v1/completions\x00x-a\x00\x00k\x00v\x00")) || len(data) != 31 {
		t.Errorf("data section %q", data)
	}
	if got := decodePairs(b); !reflect.DeepEqual(got, pairs) {
		t.Errorf("round trip %v", got)
	}
	if encodePairs(nil) != nil || decodePairs(nil) != nil {
		t.Error("empty map must serialize to nothing")
	}
	// Truncated or lying input yields no pairs, like PairsUtil::toPairs.
	for _, bad := range [][]byte{b[:len(b)-1], b[:10], {0xff, 0xff, 0xff, 0x7f}} {
		if got := decodePairs(bad); got != nil {
			t.Errorf("decodePairs(%q) = %v, want nil", bad, got)
		}
	}
}

func TestSharedDataCASRules(t *testing.T) {
	s := newSharedData()
	// A missing key is set whatever the CAS says.
	if st := s.set("vm", "k", []byte("a"), 12345); st != StatusOK {
		t.Fatalf("set missing key with cas: %v", st)
	}
	v, cas1, st := s.get("vm", "k")
	if st != StatusOK || string(v) != "a" || cas1 != 1 {
		t.Fatalf("get = %q %d %v, want a 1 Ok (the counter starts at 1)", v, cas1, st)
	}
	if st := s.set("vm", "k", []byte("b"), cas1+7); st != StatusCasMismatch {
		t.Errorf("stale cas: %v, want CasMismatch", st)
	}
	if st := s.set("vm", "k", []byte("b"), cas1); st != StatusOK {
		t.Errorf("matching cas: %v", st)
	}
	if st := s.set("vm", "k", []byte("c"), 0); st != StatusOK {
		t.Errorf("cas 0 must set unconditionally: %v", st)
	}
	v, cas3, _ := s.get("vm", "k")
	if string(v) != "c" || cas3 != 3 {
		t.Errorf("after two more sets: %q cas %d, want c 3", v, cas3)
	}
	// One global counter across keys and vm_ids.
	s.set("other", "k", []byte("x"), 0)
	if _, cas, _ := s.get("other", "k"); cas != 4 {
		t.Errorf("other vm_id cas %d, want 4", cas)
	}
	// vm_ids are separate maps.
	if _, _, st := s.get("nobody", "k"); st != StatusNotFound {
		t.Errorf("unknown vm_id: %v", st)
	}
	// The counter skips 0 when it wraps.
	s.cas = 0xffffffff
	s.set("vm", "w1", nil, 0)
	s.set("vm", "w2", nil, 0)
	_, c1, _ := s.get("vm", "w1")
	_, c2, _ := s.get("vm", "w2")
	if c1 != 0xffffffff || c2 != 1 {
		t.Errorf("wrap: %d %d, want 4294967295 1", c1, c2)
	}
	// Returned values are copies.
	v, _, _ = s.get("vm", "k")
	v[0] = 'z'
	if v2, _, _ := s.get("vm", "k"); string(v2) != "c" {
		t.Error("get returned the stored slice")
	}
}

func TestSharedDataConcurrentCASIncrements(t *testing.T) {
	s := newSharedData()
	// Create the key first: a writer that saw it missing gets CAS 0, and CAS 0
	// sets unconditionally in Envoy, so a racer descheduled between its read of
	// the missing key and its write could overwrite any number of increments.
	// With the key present every write below is CAS-checked and none may be lost.
	if st := s.set("vm", "n", []byte("0"), 0); st != StatusOK {
		t.Fatalf("initial set: %v", st)
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				for {
					v, cas, st := s.get("vm", "n")
					n := 0
					if st == StatusOK {
						fmt.Sscan(string(v), &n)
					}
					if s.set("vm", "n", []byte(fmt.Sprint(n+1)), cas) == StatusOK {
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	v, _, _ := s.get("vm", "n")
	var n int
	fmt.Sscan(string(v), &n)
	if n != 1600 {
		t.Errorf("counter %d after 1600 CAS increments", n)
	}
}

func TestSharedQueues(t *testing.T) {
	q := newSharedQueues()
	a, b := &vm{index: 0}, &vm{index: 1}
	t1 := q.register("vm", "updates", a, 1)
	if t1 == 0 {
		t.Fatal("token 0")
	}
	if got := q.resolve("vm", "updates"); got != t1 {
		t.Errorf("resolve %d, want %d", got, t1)
	}
	if q.resolve("other", "updates") != 0 {
		t.Error("queues are scoped by vm_id")
	}
	if _, st := q.dequeue(t1); st != StatusEmpty {
		t.Errorf("dequeue empty: %v", st)
	}
	if _, _, st := q.enqueue(t1+100, nil); st != StatusNotFound {
		t.Errorf("enqueue unknown: %v", st)
	}
	owner, root, _ := q.enqueue(t1, []byte("x"))
	if owner != a || root != 1 {
		t.Error("on_queue_ready target")
	}
	// Re-registering keeps the data and moves the target: last one wins.
	if t2 := q.register("vm", "updates", b, 7); t2 != t1 {
		t.Errorf("re-register token %d, want %d", t2, t1)
	}
	owner, root, _ = q.enqueue(t1, []byte("y"))
	if owner != b || root != 7 {
		t.Error("re-register did not move the target")
	}
	for _, want := range []string{"x", "y"} {
		if v, st := q.dequeue(t1); st != StatusOK || string(v) != want {
			t.Errorf("dequeue %q %v, want %q", v, st, want)
		}
	}
}

func TestOverrideHostSelection(t *testing.T) {
	c := newCluster("engines", []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"})
	addrs := func(hs []*upstreamHost) []string {
		var out []string
		for _, h := range hs {
			out = append(out, h.addr)
		}
		return out
	}
	cases := map[string][]string{
		"10.0.0.2:80":                          {"10.0.0.2:80"},
		"10.0.0.9:80,10.0.0.3:80, 10.0.0.1:80": {"10.0.0.3:80", "10.0.0.1:80"}, // unknown skipped, spaces trimmed
		"10.0.0.1:80,10.0.0.1:80":              {"10.0.0.1:80"},
		"nonsense,,":                           nil,
		"":                                     nil,
	}
	for in, want := range cases {
		if got := addrs(c.overrideHosts(in)); !reflect.DeepEqual(got, want) {
			t.Errorf("overrideHosts(%q) = %v, want %v", in, got, want)
		}
	}
	// Least request: the busier host loses whenever it is drawn against an idle one.
	c.hosts[0].active.Store(5)
	c.hosts[1].active.Store(5)
	seen := map[string]int{}
	// Two draws with replacement: the idle host wins with p = 1-(2/3)² = 5/9.
	for i := 0; i < 6000; i++ {
		seen[c.leastRequest(nil).addr]++
	}
	if seen["10.0.0.3:80"] < 3000 || seen["10.0.0.3:80"] > 3700 {
		t.Errorf("least request picks %v; the idle host should win most draws", seen)
	}
	if h := c.leastRequest(c.hosts[:2]); h != c.hosts[2] {
		t.Errorf("exclusion ignored")
	}
	for in, ok := range map[string]bool{"10.0.0.5:8000": true, "[::1]:80": true, "a,b": false, "host:80": false, "10.0.0.5": false} {
		if _, got := originalDst(in); got != ok {
			t.Errorf("originalDst(%q) ok=%v, want %v", in, got, ok)
		}
	}
}

func TestHeaderMapReplaceKeepsFirstPosition(t *testing.T) {
	m := &headerMap{}
	m.add("A", "1")
	m.add("b", "2")
	m.add("a", "3")
	m.replace("a", "9")
	if !reflect.DeepEqual(m.pairs, []Pair{{"a", "9"}, {"b", "2"}}) {
		t.Errorf("replace: %v", m.pairs)
	}
	m.remove("B")
	if v, ok := m.get("a"); !ok || v != "9" || len(m.pairs) != 1 || m.byteSize() != 2 {
		t.Errorf("after remove: %v", m.pairs)
	}
}

// The router without filters: Envoy's override_host policy on the
// destination header, tried in order, connect failures move on.
func TestRouterOverrideHostPolicy(t *testing.T) {
	a, b := newUpstream(t, nil), newUpstream(t, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close() // in the cluster, refuses connections
	h, url := startHost(t, Config{Clusters: map[string][]string{"engines": {a.addr, b.addr, dead}}, RouteCluster: "engines"})
	steer := func(v string) int {
		return do(t, "GET", url+"/", "", map[string]string{DefaultDestinationHeader: v}).code
	}
	if steer(b.addr) != 200 || b.requests.Load() != 1 || a.requests.Load() != 0 {
		t.Fatalf("first address not used: a=%d b=%d", a.requests.Load(), b.requests.Load())
	}
	if steer("10.9.9.9:1,"+a.addr+","+b.addr) != 200 || a.requests.Load() != 1 {
		t.Errorf("unknown address not skipped")
	}
	if steer(dead+","+b.addr) != 200 || b.requests.Load() != 2 {
		t.Errorf("connect failure did not move to the next address")
	}
	if got := h.UpstreamRequests()[b.addr]; got != 2 {
		t.Errorf("UpstreamRequests[b] = %d, want 2", got)
	}
	if code := steer(dead); code != 503 {
		t.Errorf("only a dead host: %d, want 503", code)
	}
	before := a.requests.Load() + b.requests.Load()
	steer("10.9.9.9:1")
	steer("")
	if got := a.requests.Load() + b.requests.Load(); got < before+1 {
		t.Errorf("no usable address: the least-request fallback did not pick a live host (%d -> %d)", before, got)
	}
}

func TestRouterOriginalDst(t *testing.T) {
	a := newUpstream(t, nil)
	_, url := startHost(t, Config{OriginalDst: true})
	if r := do(t, "GET", url+"/", "", map[string]string{DefaultDestinationHeader: a.addr}); r.code != 200 || a.requests.Load() != 1 {
		t.Errorf("original dst: %d, upstream %d", r.code, a.requests.Load())
	}
	for _, v := range []string{"", a.addr + "," + a.addr, "localhost:80"} {
		if r := do(t, "GET", url+"/", "", map[string]string{DefaultDestinationHeader: v}); r.code != 503 {
			t.Errorf("original dst %q: %d, want 503", v, r.code)
		}
	}
}

func TestServeOnListener(t *testing.T) {
	a := newUpstream(t, nil)
	h, err := New(t.Context(), Config{Clusters: map[string][]string{"c": {a.addr}}, RouteCluster: "c"})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- h.Serve(l) }()
	if r := do(t, "GET", "http://"+l.Addr().String()+"/", "", nil); r.code != 200 {
		t.Errorf("status %d", r.code)
	}
	h.Close()
	if err := <-done; err != http.ErrServerClosed {
		t.Errorf("Serve returned %v", err)
	}
}

func TestDirectResponseRoute(t *testing.T) {
	_, url := startHost(t, Config{DirectResponse: &DirectResponse{Status: 204}})
	if r := do(t, "POST", url+"/x", `{"a":1}`, nil); r.code != 204 {
		t.Errorf("status %d, want 204", r.code)
	}
	_, url = startHost(t, Config{DirectResponse: &DirectResponse{Status: 404, Body: "nothing here"}})
	if r := do(t, "GET", url+"/x", "", nil); r.code != 404 || r.body != "nothing here" {
		t.Errorf("got %d %q", r.code, r.body)
	}
}
