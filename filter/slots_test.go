package filter

import (
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/dispatch"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/sim/server"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/v8host"
)

// churnAddrs returns the n addresses of push number push: every push
// brings n addresses never seen before, as pod churn does.
func churnAddrs(push, n int) []string {
	addrs := make([]string, n)
	for i := range addrs {
		a := push*n + i
		addrs[i] = fmt.Sprintf("10.%d.%d.%d:8000", 100+a>>16, a>>8&255, a&255)
	}
	return addrs
}

// longPrompt is a completion whose prompt spans many index blocks.
func longPrompt(i int) string {
	words := strings.Repeat(fmt.Sprintf("tenant %d policy clause ", i), 400)
	return fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":4}`, words)
}

// finish answers a routed request with 200 from its destination.
func finish(host proxytest.HostEmulator, id uint32) { answer(host, id, "") }

// answer ends a routed request with a response from its destination, 503
// when that is the failing host, else 200, and returns the destination.
func answer(host proxytest.HostEmulator, id uint32, failing string) string {
	d := destination(host, id)
	status := "200"
	if d == failing {
		status = "503"
	}
	_ = host.SetProperty([]string{"upstream", "address"}, []byte(d))
	host.CallOnResponseHeaders(id, [][2]string{{":status", status}}, true)
	host.CompleteHttpContext(id)
	return d
}

// Pod churn: 10,000 distinct addresses pushed 60 at a time, with a
// request in flight across every push. A host that left the candidate set
// gives its index slot back (at once when idle, once its requests end
// otherwise), so the hosts pushed last still get prefix matching and
// shared load accounting.
func TestStatePushChurnFreesHostSlots(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	host, p := newHostWith(t, Options{Clock: func() time.Time { return now }}, RootRouter, threeEndpoints+`,"fallbacks":0,"state":{"token":"`+stateToken+`"}}`, types.OnPluginStartStatusOK)
	push := func(addrs []string) {
		t.Helper()
		id, _ := send(host, "POST", "/.kvroute/v1/state", pushBody(now.UnixMilli(), addrs...), [2]string{"authorization", "Bearer " + stateToken})
		if r := host.GetSentLocalResponse(id); r == nil || r.StatusCode != 200 {
			t.Fatalf("push: %+v", r)
		}
	}
	const perPush = 60
	pushes := (10000 + perPush - 1) / perPush
	var held uint32
	for k := 0; k < pushes; k++ {
		now = now.Add(time.Second)
		push(churnAddrs(k, perPush))
		if held != 0 {
			finish(host, held) // its host departed with it in flight
		}
		id, _ := post(host, longPrompt(k))
		finish(host, id)
		held, _ = post(host, longPrompt(k+1)) // in flight across the next push
		if k%7 == 0 {
			now = now.Add(housekeepMs * time.Millisecond)
			host.Tick()
		}
	}
	finish(host, held)
	last := churnAddrs(pushes, perPush)
	now = now.Add(time.Second)
	push(last)
	for _, h := range p.hosts {
		if h.Slot < 0 {
			t.Fatalf("after %d addresses host %s has no index slot", pushes*perPush, h.Address)
		}
	}
	// Prefix matching: the same prompt again is predicted cached where the
	// first went.
	before := counter(t, host, "kvroute.router.predicted_cached_tokens")
	first, _ := post(host, longPrompt(-1))
	dest := destination(host, first)
	finish(host, first)
	again, _ := post(host, longPrompt(-1))
	if d := destination(host, again); d != dest {
		t.Errorf("the repeated prompt went to %s, the first to %s", d, dest)
	}
	if got := counter(t, host, "kvroute.router.predicted_cached_tokens") - before; got == 0 {
		t.Error("the repeated prompt was predicted no cached tokens: the last hosts get no prefix matching")
	}
	// Load accounting: the request in flight counts on its host's slot.
	ref, ok := p.disp.Index().Lookup(dest)
	if !ok {
		t.Fatalf("%s is not in the slot table", dest)
	}
	if l := p.disp.Index().Loads(nil)[ref.Slot]; l.InFlight != 1 {
		t.Errorf("load of %s while a request is in flight = %+v, want 1 in flight", dest, l)
	}
	finish(host, again)
	if l := p.disp.Index().Loads(nil)[ref.Slot]; l.InFlight != 0 {
		t.Errorf("load of %s after the request = %+v, want 0", dest, l)
	}
	if got := counter(t, host, "kvroute.router.host_slots.freed"); got < uint64(pushes*perPush-2*perPush) {
		t.Errorf("host_slots.freed = %d after %d addresses", got, pushes*perPush)
	}
	if n := p.disp.Index().Slots(); n > 2*perPush+1 {
		t.Errorf("the slot table has %d slots for %d hosts at a time", n, perPush)
	}
}

// A host that leaves the pushed set with a request in flight keeps its
// slot until the request ends (the tick then frees it), or until the grace
// period passes if the request never ends.
func TestDepartedHostSlotFreedOnTick(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	host, p := newHostWith(t, Options{Clock: func() time.Time { return now }}, RootRouter, threeEndpoints+`,"strategy":"round_robin","fallbacks":0,"state":{"token":"`+stateToken+`"}}`, types.OnPluginStartStatusOK)
	push := func(addrs ...string) {
		t.Helper()
		now = now.Add(time.Second)
		id, _ := send(host, "POST", "/.kvroute/v1/state", pushBody(now.UnixMilli(), addrs...), [2]string{"authorization", "Bearer " + stateToken})
		if r := host.GetSentLocalResponse(id); r == nil || r.StatusCode != 200 {
			t.Fatalf("push: %+v", r)
		}
	}
	tick := func() {
		now = now.Add(housekeepMs * time.Millisecond)
		host.Tick()
	}
	freed := func() uint64 { return counter(t, host, "kvroute.router.host_slots.freed") }
	const a, b = "10.1.0.1:8000", "10.1.0.2:8000"
	push(a)
	ended, _ := post(host, completion) // to a, ends after a leaves
	stuck, _ := post(host, completion) // to a, never ends
	if destination(host, ended) != a || destination(host, stuck) != a {
		t.Fatal("the requests did not go to the only host")
	}
	base := freed()
	push(b)
	if _, ok := p.disp.Index().Lookup(a); !ok {
		t.Fatal("a departed host with requests in flight lost its slot at once")
	}
	finish(host, ended)
	tick()
	if _, ok := p.disp.Index().Lookup(a); !ok || freed() != base {
		t.Fatal("a departed host with a request still in flight lost its slot")
	}
	now = now.Add(dispatch.SlotGraceMs * time.Millisecond)
	tick()
	if _, ok := p.disp.Index().Lookup(a); ok || freed() != base+1 {
		t.Fatalf("after the grace period the departed host keeps its slot (freed %d)", freed()-base)
	}
	finish(host, stuck) // its load goes to an old generation: nothing counts
	for s, l := range p.disp.Index().Loads(nil) {
		if l != (index.Load{}) {
			t.Errorf("slot %d load %+v after the stale request ended", s, l)
		}
	}
	// Idle departed hosts are freed by the push itself.
	push(a)
	if _, ok := p.disp.Index().Lookup(b); ok || freed() != base+2 {
		t.Errorf("an idle departed host kept its slot (freed %d)", freed()-base)
	}
}

// The churn through the built module, two workers taking the pushes in
// turn: after 10,000 distinct addresses the engines pushed last get prefix
// matching and load counts, and the shared data stops growing.
func TestWasmPushChurnFreesHostSlots(t *testing.T) {
	f := startFleet(t, server.Options{Replicas: 4, TimeScale: 0, TimeScaleSet: true})
	engines := f.Addrs()
	// The engines are not among the static endpoints: they first appear
	// in the last push, when 10,000 addresses have come and gone.
	h, url := startRouterConfig(t, engines, 2, `{"endpoints":[{"address":"192.0.2.1:8000"}],"fallbacks":0,"state":{"token":"`+stateToken+`"}}`)
	auth := map[string]string{"authorization": "Bearer " + stateToken}
	footprint := func() (keys, bytes int) {
		for _, k := range h.SharedDataKeys() {
			v, _, _ := h.SharedData(k)
			keys++
			bytes += len(k) + len(v)
		}
		return keys, bytes
	}
	const perPush = 60
	pushes := (10000 + perPush - 1) / perPush
	var keysAt, bytesAt int
	ts := time.Now().Add(-time.Duration(pushes) * time.Millisecond).UnixMilli()
	for k := 0; k < pushes; k++ {
		ts++
		if code, body, _ := testenv.Call(t, "POST", url+"/.kvroute/v1/state", pushBody(ts, churnAddrs(k, perPush)...), auth); code != 200 {
			t.Fatalf("push %d: %d %s", k, code, body)
		}
		if k == pushes/2 {
			keysAt, bytesAt = footprint()
		}
	}
	// The last push: the engines, new addresses, among hosts that are down.
	var hosts []string
	for _, a := range churnAddrs(pushes, perPush-len(engines)) {
		hosts = append(hosts, fmt.Sprintf(`{"address":%q,"healthy":false}`, a))
	}
	for _, a := range engines {
		hosts = append(hosts, fmt.Sprintf(`{"address":%q}`, a))
	}
	last := fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[%s]}`, ts+1, strings.Join(hosts, ","))
	if code, body, _ := testenv.Call(t, "POST", url+"/.kvroute/v1/state", last, auth); code != 200 {
		t.Fatalf("last push: %d %s", code, body)
	}
	before := h.CounterValue("kvroute.router.predicted_cached_tokens")
	prompt := chatBody(systemPrompt(7), "the same question")
	for i := 0; i < 4; i++ { // both workers, twice
		if code, body, _ := testenv.Call(t, "POST", url+"/v1/chat/completions", prompt, nil); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, body)
		}
	}
	if got := h.CounterValue("kvroute.router.predicted_cached_tokens") - before; got == 0 {
		t.Error("a repeated prompt was predicted no cached tokens: the engines pushed last get no prefix matching")
	}
	served := 0
	for _, n := range h.UpstreamRequests() {
		if n > 0 {
			served++
		}
	}
	if served != 1 {
		t.Errorf("the repeated prompt went to %d engines, want 1: %v", served, h.UpstreamRequests())
	}
	// Load accounting: the engine's record in the shared load counters is
	// this incarnation's (the requests were counted there, and given back).
	ix, err := index.New(hostStore{h}, index.Config{})
	if err != nil {
		t.Fatal(err)
	}
	load, _, _ := h.SharedData("kvroute/index/load")
	for a, n := range h.UpstreamRequests() {
		ref, ok := ix.Lookup(a)
		if !ok {
			t.Fatalf("engine %s has no index slot", a)
		}
		if off := 8 + ref.Slot*20; off+20 > len(load) || binary.LittleEndian.Uint32(load[off:]) != ref.Gen {
			t.Errorf("engine %s served %d requests, none counted in its load record (slot %d)", a, n, ref.Slot)
		}
	}
	// A stream's last callbacks may run after the client has its answer.
	waitLoadsZero(t, hostStore{h})
	keys, bytes := footprint()
	t.Logf("shared data after %d addresses: %d keys, %d bytes (%d keys, %d bytes halfway)", pushes*perPush+perPush, keys, bytes, keysAt, bytesAt)
	if keys > keysAt+64 || bytes > 2*bytesAt {
		t.Errorf("shared data grew from %d keys, %d bytes halfway to %d keys, %d bytes", keysAt, bytesAt, keys, bytes)
	}
	if got := h.CounterValue("kvroute.router.host_slots.freed"); got < int64(pushes*perPush-2*perPush) {
		t.Errorf("host_slots.freed = %d after %d addresses", got, pushes*perPush)
	}
}

// The churn in V8 (Envoy's default engine), two workers writing the slot
// table under the host's CAS: after 10,000 addresses the engines pushed
// last get slots and prefix matching, and an older push is refused.
func TestV8PushChurnFreesHostSlots(t *testing.T) {
	needV8(t)
	f := startFleet(t, server.Options{Replicas: 4, TimeScale: 0, TimeScaleSet: true})
	engines := f.Addrs()
	h, err := v8host.Start(v8host.Config{Module: testenv.ModulePath(t), RootID: RootRouter, Upstreams: engines, Workers: 2,
		Configuration: `{"endpoints":[{"address":"192.0.2.1:8000"}],"fallbacks":0,"state":{"token":"` + stateToken + `"}}`})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	// A connection of its own per call: the V8 host keeps a connection on
	// one worker, so successive calls go to the workers in turn.
	auth := http.Header{"Authorization": {"Bearer " + stateToken}, "Connection": {"close"}}
	own := http.Header{"Connection": {"close"}}
	state := h.Filtered + "/.kvroute/v1/state"
	const perPush = 60
	pushes := (10000 + perPush - 1) / perPush
	ts := time.Now().Add(-time.Duration(pushes) * time.Millisecond).UnixMilli()
	for k := 0; k < pushes; k++ {
		ts++
		if code, body := v8Post(t, state, pushBody(ts, churnAddrs(k, perPush)...), auth); code != 200 {
			t.Fatalf("push %d: %d %s", k, code, body)
		}
	}
	if code, body := v8Post(t, state, pushBody(ts-1000, engines...), auth); code != 409 {
		t.Errorf("a push older than the state in force: %d %s, want 409", code, body)
	}
	if code, body := v8Post(t, state, pushBody(ts+1, engines...), auth); code != 200 {
		t.Fatalf("last push: %d %s", code, body)
	}
	prompt := chatBody(systemPrompt(3), "the same question")
	for i := 0; i < 4; i++ {
		if code, body := v8Post(t, h.Filtered+"/v1/chat/completions", prompt, own); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, body)
		}
	}
	st, err := h.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Metrics["kvroute.router.predicted_cached_tokens"].Value == 0 {
		t.Error("a repeated prompt was predicted no cached tokens: the engines pushed last get no prefix matching")
	}
	if got := st.Metrics["kvroute.router.host_slots.freed"].Value; got < float64(pushes*perPush-2*perPush) {
		t.Errorf("host_slots.freed = %v after %d addresses", got, pushes*perPush)
	}
	if got := st.Metrics["kvroute.router.state.rejected_older"].Value; got != 1 {
		t.Errorf("state.rejected_older = %v, want 1", got)
	}
	ix, err := index.New(v8Store{h}, index.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range engines {
		if _, ok := ix.Lookup(a); !ok {
			t.Errorf("engine %s has no index slot", a)
		}
	}
	if n := ix.Slots(); n > 2*perPush+1 {
		t.Errorf("the slot table has %d slots for %d hosts at a time", n, perPush)
	}
	waitLoadsZero(t, v8Store{h})
	if st.Traps != 0 {
		t.Errorf("traps: %d %v", st.Traps, st.LastErrors)
	}
}

// blockingUpstream answers only when release is closed.
func blockingUpstream(t testing.TB) (addr string, release func()) {
	t.Helper()
	ch := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		<-ch
		w.Header().Set("content-type", "application/json")
		io.WriteString(w, benchCompletion)
	}))
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(func() { release(); up.Close() })
	return up.Listener.Addr().String(), release
}

// tickHost is what departedFreedOnTick needs of a host running the router
// on one worker: a POST, its shared data and a counter.
type tickHost struct {
	post    func(path, body string, hdr map[string]string) int
	store   index.Store
	counter func(name string) int64
}

// departedFreedOnTick checks, in a host with its own ticks, that a host
// leaving the pushed set while a request is in flight on it keeps its slot,
// and that once the request ends a tick frees it. The router's only static
// endpoint is 192.0.2.1:8000; a and b block until released.
//
// No sleep stands for "a tick or more": both a and b leave with a request
// in flight, b's ends first, and the tick that frees b's slot is the proof
// that a tick came and went; it judged a's slot in the same pass (one Sync
// of the slot table) and must have kept it.
func departedFreedOnTick(t *testing.T, th tickHost, a, b blocked, other string) {
	auth := map[string]string{"authorization": "Bearer " + stateToken}
	ix, err := index.New(th.store, index.Config{})
	if err != nil {
		t.Fatal(err)
	}
	hasSlot := func(addr string) bool {
		_, ok := ix.Lookup(addr)
		return ok
	}
	inFlight := func(addr string) func() bool {
		return func() bool {
			ref, ok := ix.Lookup(addr)
			l := ix.Loads(nil)
			return ok && ref.Slot < len(l) && l[ref.Slot].InFlight == 1
		}
	}
	ts := time.Now().UnixMilli()
	// One request in flight on each: a is the only candidate, then b.
	done := map[string]chan int{}
	for i, e := range []blocked{a, b} {
		if code := th.post("/.kvroute/v1/state", pushBody(ts+int64(i), e.addr), auth); code != 200 {
			t.Fatalf("push of %s: %d", e.addr, code)
		}
		ch := make(chan int, 1)
		done[e.addr] = ch
		go func() { ch <- th.post("/v1/completions", llamaCompletion, nil) }()
		testenv.WaitFor(t, "a request in flight on "+e.addr, inFlight(e.addr))
	}
	ended := func(e blocked) {
		t.Helper()
		e.release()
		select {
		case code := <-done[e.addr]:
			if code != 200 {
				t.Fatalf("the request in flight on %s ended with %d", e.addr, code)
			}
		case <-time.After(testenv.WaitTimeout):
			t.Fatalf("the request in flight on %s never ended", e.addr)
		}
	}
	freed := th.counter("kvroute.router.host_slots.freed")
	if code := th.post("/.kvroute/v1/state", pushBody(ts+2, other), auth); code != 200 {
		t.Fatalf("push of %s alone: %d", other, code)
	}
	if !hasSlot(a.addr) || !hasSlot(b.addr) {
		t.Fatalf("a departed engine lost its slot at the push with a request in flight (%s: %v, %s: %v)", a.addr, hasSlot(a.addr), b.addr, hasSlot(b.addr))
	}
	ended(b)
	testenv.WaitFor(t, "a tick to free "+b.addr+"'s slot after its request ended", func() bool { return !hasSlot(b.addr) })
	if !hasSlot(a.addr) {
		t.Fatal("the tick that freed the idle departed engine's slot also freed the one with a request in flight")
	}
	if got := th.counter("kvroute.router.host_slots.freed"); got != freed+1 {
		t.Errorf("host_slots.freed went from %d to %d after the first tick, want one more", freed, got)
	}
	ended(a)
	testenv.WaitFor(t, "a tick to free "+a.addr+"'s slot after its request ended", func() bool { return !hasSlot(a.addr) })
	if got := th.counter("kvroute.router.host_slots.freed"); got != freed+2 {
		t.Errorf("host_slots.freed went from %d to %d, want two more", freed, got)
	}
}

// blocked is an engine from blockingUpstream.
type blocked struct {
	addr    string
	release func()
}

func blockedEngine(t testing.TB) blocked {
	addr, release := blockingUpstream(t)
	return blocked{addr, release}
}

const tickConfig = `{"endpoints":[{"address":"192.0.2.1:8000"}],"fallbacks":0,"state":{"token":"` + stateToken + `"}}`

// In the built module with wasmhost's ticks.
func TestWasmDepartedHostSlotFreedOnTick(t *testing.T) {
	a, b := blockedEngine(t), blockedEngine(t)
	other := jsonUpstreams(t, 1, benchCompletion)[0]
	h, url := startRouterConfig(t, []string{a.addr, b.addr, other}, 1, tickConfig)
	departedFreedOnTick(t, tickHost{
		post: func(path, body string, hdr map[string]string) int {
			code, _, _ := testenv.Call(t, "POST", url+path, body, hdr)
			return code
		},
		store:   hostStore{h},
		counter: h.CounterValue,
	}, a, b, other)
}

// In V8, whose ticks are node timers.
func TestV8DepartedHostSlotFreedOnTick(t *testing.T) {
	needV8(t)
	a, b := blockedEngine(t), blockedEngine(t)
	other := jsonUpstreams(t, 1, benchCompletion)[0]
	h, err := v8host.Start(v8host.Config{Module: testenv.ModulePath(t), RootID: RootRouter, Upstreams: []string{a.addr, b.addr, other}, Configuration: tickConfig})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	departedFreedOnTick(t, tickHost{
		post: func(path, body string, hdr map[string]string) int {
			hs := http.Header{"Connection": {"close"}}
			for k, v := range hdr {
				hs.Set(k, v)
			}
			code, _ := v8Post(t, h.Filtered+path, body, hs)
			return code
		},
		store: v8Store{h},
		counter: func(name string) int64 {
			st, err := h.Stats()
			if err != nil {
				t.Fatal(err)
			}
			return int64(st.Metrics[name].Value)
		},
	}, a, b, other)
}
