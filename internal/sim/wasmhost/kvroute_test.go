package wasmhost

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
)

// Wasm integration tests of dist/kvroute.wasm (issue 2, "Tests").

func routerConfig(addrs []string, extra string) string {
	var eps []string
	for _, a := range addrs {
		eps = append(eps, fmt.Sprintf(`{"address":%q}`, a))
	}
	return `{"strategy":"round_robin","endpoints":[` + strings.Join(eps, ",") + `]` + extra + `}`
}

func threeUpstreams(t *testing.T) ([]*upstream, []string) {
	var ups []*upstream
	var addrs []string
	for i := 0; i < 3; i++ {
		u := newUpstream(t, nil)
		ups = append(ups, u)
		addrs = append(addrs, u.addr)
	}
	return ups, addrs
}

// Each worker runs its own round robin. Streams are dealt to the two
// workers in turn (DispatchStream), so the spread is exact whatever
// connections the client uses: with per-connection dispatch a request on
// a new connection (the client's pool may open one at any time) can land
// on the other worker mid-count.
func TestKvrouteSpreadsThirtyRequestsEvenly(t *testing.T) {
	ups, addrs := threeUpstreams(t)
	h, url := startHost(t, Config{Module: testenv.Module(t), VMID: "kvroute", Workers: 2, Dispatch: DispatchStream,
		Filters:  []Filter{{RootID: "kvroute.router", Configuration: routerConfig(addrs, ""), AllowOnHeadersStopIteration: true}},
		Clusters: map[string][]string{"engines": addrs}, RouteCluster: "engines"})
	for i := 0; i < 30; i++ {
		r := do(t, "POST", url+"/v1/completions", `{"model":"m","prompt":"hello"}`, nil)
		if r.code != 200 {
			t.Fatalf("request %d: %d %s", i, r.code, r.body)
		}
	}
	for i, u := range ups {
		if got := u.requests.Load(); got != 10 {
			t.Errorf("upstream %d got %d requests, want 10", i, got)
		}
	}
	if got := h.CounterValue("kvroute.router.requests.routed"); got != 30 {
		t.Errorf("kvroute.router.requests.routed = %d, want 30", got)
	}
	if h.VMFailures() != 0 {
		t.Errorf("VM failures: %v", h.LogsContaining("failed"))
	}
}

// A client's destination header never picks the engine: round robin
// over two workers (see TestKvrouteSpreadsThirtyRequestsEvenly) gives each
// engine exactly its share, and an address the client names gets nothing.
func TestKvrouteClientDestinationHeaderNeverSteers(t *testing.T) {
	for _, origDst := range []bool{false, true} {
		t.Run(fmt.Sprintf("original_dst=%v", origDst), func(t *testing.T) {
			ups, addrs := threeUpstreams(t)
			attacker := newUpstream(t, nil) // not an endpoint: an SSRF target
			extra := ""
			if origDst {
				extra = `,"fallbacks":0` // ORIGINAL_DST takes one address
			}
			_, url := startHost(t, Config{Module: testenv.Module(t), VMID: "kvroute", Workers: 2, Dispatch: DispatchStream,
				Filters:  []Filter{{RootID: "kvroute.router", Configuration: routerConfig(addrs, extra), AllowOnHeadersStopIteration: true}},
				Clusters: map[string][]string{"engines": addrs}, RouteCluster: "engines", OriginalDst: origDst})
			steer := []string{addrs[0], attacker.addr, addrs[0] + "," + addrs[0], attacker.addr + "," + addrs[0]}
			for i := 0; i < 30; i++ {
				r := do(t, "POST", url+"/v1/completions", `{"model":"m","prompt":"x"}`,
					map[string]string{"x-gateway-destination-endpoint": steer[i%len(steer)]})
				if r.code != 200 {
					t.Fatalf("request %d: %d %s", i, r.code, r.body)
				}
			}
			if got := attacker.requests.Load(); got != 0 {
				t.Errorf("the address the client put in the destination header got %d requests", got)
			}
			for i, u := range ups {
				if got := u.requests.Load(); got != 10 {
					t.Errorf("upstream %d got %d requests, want 10 (client header steered?)", i, got)
				}
			}
		})
	}
}

func TestKvrouteMalformedConfigFailsPluginStart(t *testing.T) {
	_, err := New(t.Context(), Config{Module: testenv.Module(t), VMID: "kvroute",
		Filters: []Filter{{RootID: "kvroute.router",
			Configuration: `{"endpoints":[{"address":"10.0.0.1:8000"},{"address":"not-an-address"}]}`}}})
	if err == nil {
		t.Fatal("New accepted a plugin configuration with a malformed endpoint address")
	}
	var pse *PluginStartError
	if !errors.As(err, &pse) {
		t.Fatalf("error is %T, want *PluginStartError: %v", err, err)
	}
	if pse.RootID != "kvroute.router" {
		t.Errorf("RootID = %q", pse.RootID)
	}
	if !strings.Contains(err.Error(), "endpoints[1].address") {
		t.Errorf("the error does not name the bad field endpoints[1].address: %v", err)
	}
}

func TestKvrouteTrapOnOneWorkerOtherKeepsServing(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("fail_open=%v", failOpen), func(t *testing.T) {
			ups, addrs := threeUpstreams(t)
			h, url := startHost(t, Config{Module: testenv.Module(t), VMID: "kvroute", Workers: 2, Dispatch: DispatchStream, FailOpen: failOpen,
				Filters:  []Filter{{RootID: "kvroute.router", Configuration: routerConfig(addrs, `,"testHooks":true`), AllowOnHeadersStopIteration: true}},
				Clusters: map[string][]string{"engines": addrs}, RouteCluster: "engines"})
			r := do(t, "POST", url+"/v1/completions", `{"model":"m","prompt":"x"}`, map[string]string{"x-kvroute-test-panic": "trap"})
			wantTrap := 503
			if failOpen {
				wantTrap = 200
			}
			if r.code != wantTrap {
				t.Fatalf("trapping request: %d %s, want %d", r.code, r.body, wantTrap)
			}
			failed := 0
			for _, w := range h.Workers() {
				if w.Failed {
					failed++
				}
			}
			if failed != 1 || h.VMFailures() != 1 {
				t.Fatalf("%d workers failed (VMFailures %d), want exactly 1", failed, h.VMFailures())
			}
			codes := map[int]int{}
			for i := 0; i < 10; i++ {
				codes[do(t, "POST", url+"/v1/completions", `{"model":"m","prompt":"y"}`, nil).code]++
			}
			if failOpen {
				if codes[200] != 10 {
					t.Errorf("fail open: codes %v, want 10×200", codes)
				}
			} else if codes[200] != 5 || codes[503] != 5 {
				t.Errorf("fail closed: codes %v, want 5×200 from the live worker and 5×503 from the failed one", codes)
			}
			var total int64
			for _, u := range ups {
				total += u.requests.Load()
			}
			if want := int64(codes[200]); failOpen {
				want++
				if total != want {
					t.Errorf("upstreams got %d requests, want %d", total, want)
				}
			} else if total != want {
				t.Errorf("upstreams got %d requests, want %d", total, want)
			}
		})
	}
}

func TestKvrouteRecoveredPanicRoutesRequest(t *testing.T) {
	_, addrs := threeUpstreams(t)
	h, url := startHost(t, Config{Module: testenv.Module(t), VMID: "kvroute",
		Filters:  []Filter{{RootID: "kvroute.router", Configuration: routerConfig(addrs, `,"testHooks":true`), AllowOnHeadersStopIteration: true}},
		Clusters: map[string][]string{"engines": addrs}, RouteCluster: "engines"})
	r := do(t, "POST", url+"/v1/completions", `{"model":"m","prompt":"x"}`, map[string]string{"x-kvroute-test-panic": "recover"})
	if r.code != 200 {
		t.Fatalf("%d %s", r.code, r.body)
	}
	if got := h.CounterValue("kvroute.router.recovered_panics"); got != 1 {
		t.Errorf("recovered_panics = %d, want 1", got)
	}
	if h.VMFailures() != 0 {
		t.Errorf("a recovered panic failed the VM")
	}
}

var _ = net.JoinHostPort

// The chain router then pd, both plugins of the one module in each VM
// (streams dealt in turn: see TestKvrouteSpreadsThirtyRequestsEvenly).
func TestKvrouteRouterThenPDChain(t *testing.T) {
	ups, addrs := threeUpstreams(t)
	h, url := startHost(t, Config{Module: testenv.Module(t), VMID: "kvroute", Workers: 2, Dispatch: DispatchStream,
		Filters: []Filter{
			{RootID: "kvroute.router", Configuration: routerConfig(addrs, ""), AllowOnHeadersStopIteration: true},
			{RootID: "kvroute.pd", Configuration: routerConfig(addrs, ""), AllowOnHeadersStopIteration: true},
		},
		Clusters: map[string][]string{"engines": addrs}, RouteCluster: "engines"})
	for i := 0; i < 30; i++ {
		if r := do(t, "POST", url+"/v1/completions", `{"model":"m","prompt":"x"}`, nil); r.code != 200 {
			t.Fatalf("request %d: %d %s", i, r.code, r.body)
		}
	}
	for i, u := range ups {
		if got := u.requests.Load(); got != 10 {
			t.Errorf("upstream %d got %d, want 10", i, got)
		}
	}
	if h.VMFailures() != 0 {
		t.Error(h.LogsContaining("failed"))
	}
}

// Without allow_on_headers_stop_iteration Envoy holds the body from a filter
// that paused in request headers: kvroute.router, which waits for the body
// to route, then never routes, exactly as it would stall in such an Envoy.
func TestKvrouteBodyRoutingStallsWithoutAllowOnHeadersStopIteration(t *testing.T) {
	ups, addrs := threeUpstreams(t)
	h, url := startHost(t, Config{Module: testenv.Module(t), VMID: "kvroute", StreamIdleTimeout: 400 * time.Millisecond,
		Filters:  []Filter{{RootID: "kvroute.router", Configuration: routerConfig(addrs, "")}},
		Clusters: map[string][]string{"engines": addrs}, RouteCluster: "engines"})
	r := do(t, "POST", url+"/v1/completions", `{"model":"m","prompt":"hello"}`, nil)
	if r.code != 408 {
		t.Errorf("status %d %q, want 408 (stalled until the stream idle timeout)", r.code, r.body)
	}
	for i, u := range ups {
		if u.requests.Load() != 0 {
			t.Errorf("upstream %d got a request", i)
		}
	}
	if got := h.CounterValue("kvroute.router.requests.routed"); got != 0 {
		t.Errorf("routed = %d, want 0", got)
	}
}
