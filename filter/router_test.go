package filter

import (
	"strings"
	"testing"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

const threeEndpoints = `{"endpoints":[{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"},{"address":"10.0.0.3:8000"}]`

// newHost starts an emulated plugin with root id rootID and configuration cfg
// and fails the test unless start returns want.
func newHost(t *testing.T, rootID, cfg string, want types.OnPluginStartStatus) proxytest.HostEmulator {
	t.Helper()
	opt := proxytest.NewEmulatorOption().
		WithVMContext(NewVMContext("test")).
		WithPluginConfiguration([]byte(cfg)).
		WithProperty([]string{"plugin_root_id"}, []byte(rootID))
	host, reset := proxytest.NewHostEmulator(opt)
	t.Cleanup(reset)
	if got := host.StartPlugin(); got != want {
		t.Fatalf("StartPlugin = %v, want %v; critical logs: %v", got, want, host.GetCriticalLogs())
	}
	return host
}

func header(hs [][2]string, name string) (string, int) {
	var v string
	n := 0
	for _, h := range hs {
		if strings.EqualFold(h[0], name) {
			v = h[1]
			n++
		}
	}
	return v, n
}

func counter(t *testing.T, host proxytest.HostEmulator, name string) uint64 {
	t.Helper()
	v, err := host.GetCounterMetric(name)
	if err != nil {
		t.Fatalf("metric %s: %v", name, err)
	}
	return v
}

func request(host proxytest.HostEmulator, extra ...[2]string) (uint32, types.Action) {
	id := host.InitializeHttpContext()
	hs := append([][2]string{{":method", "POST"}, {":path", "/v1/completions"}, {":authority", "gw"}}, extra...)
	return id, host.CallOnRequestHeaders(id, hs, false)
}

func TestRouterRoundRobin(t *testing.T) {
	host := newHost(t, RootRouter, threeEndpoints+`,"fallbacks":1}`, types.OnPluginStartStatusOK)
	want := []string{
		"10.0.0.1:8000,10.0.0.2:8000", "10.0.0.2:8000,10.0.0.3:8000", "10.0.0.3:8000,10.0.0.1:8000",
		"10.0.0.1:8000,10.0.0.2:8000", "10.0.0.2:8000,10.0.0.3:8000", "10.0.0.3:8000,10.0.0.1:8000",
	}
	for i, w := range want {
		id, action := request(host)
		if action != types.ActionContinue {
			t.Fatalf("request %d: action %v, want Continue", i, action)
		}
		got, n := header(host.GetCurrentRequestHeaders(id), "x-gateway-destination-endpoint")
		if got != w || n != 1 {
			t.Errorf("request %d: destination %q (%d values), want %q", i, got, n, w)
		}
	}
	if got := counter(t, host, "kvroute.router.requests.routed"); got != 6 {
		t.Errorf("routed = %d, want 6", got)
	}
}

func TestRouterStripsClientRoutingHeaders(t *testing.T) {
	host := newHost(t, RootRouter, threeEndpoints+`,"fallbacks":0}`, types.OnPluginStartStatusOK)
	id, _ := request(host,
		[2]string{"x-gateway-destination-endpoint", "169.254.169.254:80"},
		[2]string{"X-Gateway-Destination-Endpoint", "10.0.0.3:8000"},
		[2]string{"x-kvroute-prefill-host", "169.254.169.254:80"},
		[2]string{"x-kvroute-test-panic", "recover"}, // testHooks off: just stripped
		[2]string{"x-other", "kept"})
	hs := host.GetCurrentRequestHeaders(id)
	if got, n := header(hs, "x-gateway-destination-endpoint"); got != "10.0.0.1:8000" || n != 1 {
		t.Errorf("destination = %q (%d values), want only the filter's 10.0.0.1:8000", got, n)
	}
	for _, h := range hs {
		if strings.HasPrefix(h[0], "x-kvroute-") {
			t.Errorf("internal header %s reached the upstream", h[0])
		}
	}
	if got, _ := header(hs, "x-other"); got != "kept" {
		t.Errorf("unrelated header lost: %v", hs)
	}
	if got := counter(t, host, "kvroute.router.recovered_panics"); got != 0 {
		t.Errorf("test hook fired with testHooks off: recovered_panics = %d", got)
	}
}

func TestRouterCustomHeaderAndNoEndpoints(t *testing.T) {
	host := newHost(t, RootRouter, `{"destinationHeader":"x-dest"}`, types.OnPluginStartStatusOK)
	id, action := request(host, [2]string{"x-dest", "10.9.9.9:1"}, [2]string{"x-gateway-destination-endpoint", "a:1"})
	if action != types.ActionContinue {
		t.Fatalf("action %v", action)
	}
	hs := host.GetCurrentRequestHeaders(id)
	if _, n := header(hs, "x-dest"); n != 0 {
		t.Errorf("client x-dest survived with no endpoints configured: %v", hs)
	}
	// Only the configured header is kvroute's; the default name is not touched.
	if got, _ := header(hs, "x-gateway-destination-endpoint"); got != "a:1" {
		t.Errorf("unrelated header changed: %v", hs)
	}
	if got := counter(t, host, "kvroute.router.requests.no_endpoints"); got != 1 {
		t.Errorf("no_endpoints = %d, want 1", got)
	}
}

func TestPluginStartFailsOnBadConfigNamingTheField(t *testing.T) {
	host := newHost(t, RootRouter, `{"endpoints":[{"address":"10.0.0.1:8000"},{"address":"10.0.0.2"}]}`, types.OnPluginStartStatusFailed)
	logs := strings.Join(host.GetCriticalLogs(), "\n")
	if !strings.Contains(logs, "kvroute.router: invalid plugin configuration: endpoints[1].address") {
		t.Errorf("critical log does not name the field: %q", logs)
	}
}

func TestPluginStartFailsOnUnknownRootID(t *testing.T) {
	host := newHost(t, "kvroute.routr", `{}`, types.OnPluginStartStatusFailed)
	if logs := strings.Join(host.GetCriticalLogs(), "\n"); !strings.Contains(logs, `unknown root id "kvroute.routr"`) {
		t.Errorf("critical log = %q", logs)
	}
}

func TestPDPassesThrough(t *testing.T) {
	host := newHost(t, RootPD, threeEndpoints+`}`, types.OnPluginStartStatusOK)
	id, action := request(host, [2]string{"x-kvroute-prefill-host", "10.0.0.1:8000"})
	if action != types.ActionContinue {
		t.Fatalf("action %v", action)
	}
	if got, _ := header(host.GetCurrentRequestHeaders(id), "x-kvroute-prefill-host"); got != "10.0.0.1:8000" {
		t.Errorf("pd must leave the router's headers alone, got %v", host.GetCurrentRequestHeaders(id))
	}
}

func TestTestHookRecoverFailsOpen(t *testing.T) {
	host := newHost(t, RootRouter, threeEndpoints+`,"fallbacks":0,"testHooks":true}`, types.OnPluginStartStatusOK)
	id, action := request(host,
		[2]string{"x-kvroute-test-panic", "recover"},
		[2]string{"x-gateway-destination-endpoint", "169.254.169.254:80"})
	if action != types.ActionContinue {
		t.Fatalf("action after recovered panic = %v, want Continue", action)
	}
	hs := host.GetCurrentRequestHeaders(id)
	if got, n := header(hs, "x-gateway-destination-endpoint"); n != 1 || got == "169.254.169.254:80" {
		t.Errorf("after fail-open destination = %q (%d values); the client's value must be gone", got, n)
	}
	if got := counter(t, host, "kvroute.router.recovered_panics"); got != 1 {
		t.Errorf("recovered_panics = %d, want 1", got)
	}
	if got := counter(t, host, "kvroute.router.requests.failed_open"); got != 1 {
		t.Errorf("failed_open = %d, want 1", got)
	}
	if logs := strings.Join(host.GetErrorLogs(), "\n"); !strings.Contains(logs, "recovered panic in kvroute.router on_request_headers") {
		t.Errorf("error logs = %q", logs)
	}
	// The VM keeps serving.
	id, action = request(host)
	if got, _ := header(host.GetCurrentRequestHeaders(id), "x-gateway-destination-endpoint"); action != types.ActionContinue || got == "" {
		t.Errorf("next request not routed: action %v, destination %q", action, got)
	}
}

func TestTestHookTrapIsNotRecovered(t *testing.T) {
	host := newHost(t, RootRouter, threeEndpoints+`,"testHooks":true}`, types.OnPluginStartStatusOK)
	defer func() {
		r := recover()
		if _, ok := r.(trapPanic); !ok {
			t.Errorf("want the trap hook's panic to escape the callback, got %v", r)
		}
		if got := counter(t, host, "kvroute.router.recovered_panics"); got != 0 {
			t.Errorf("trap counted as recovered: %d", got)
		}
	}()
	request(host, [2]string{"x-kvroute-test-panic", "trap"})
	t.Error("trap hook returned normally")
}

// Two router plugins in one VM id (as two Envoy workers) share one
// round-robin sequence through shared data.
func TestRoundRobinIsSharedAcrossPlugins(t *testing.T) {
	host := newHost(t, RootRouter, threeEndpoints+`,"fallbacks":0}`, types.OnPluginStartStatusOK)
	_ = host
	cfgHost := newHostPlugin(t, threeEndpoints+`,"fallbacks":0}`)
	a, b := cfgHost[0], cfgHost[1]
	got := []string{a.destinations(), b.destinations(), b.destinations(), a.destinations(), b.destinations(), a.destinations()}
	want := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("shared sequence = %v, want %v", got, want)
		}
	}
}
