package envoy_test

import (
	"slices"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"

	"github.com/kvroute/kvroute/internal/deploy/manifests"
	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/wasmhosttest"
)

// withTestHooks turns on the module's test hooks in the shipped plugin
// configuration (a textual rewrite, as remap does for addresses), so that a
// request can make the VM trap.
const withTestHooks = `"strategy": "kv_cache_aware"`

// A VM that trapped, under each shipped bootstrap's failure policy. FAIL_OPEN
// (envoy.yaml): every later request passes the dead filter untouched and the
// cluster's fallback picks, and the header_mutation filter in front of the
// Wasm filters still removes a client's destination header, so the client
// steers nothing. FAIL_CLOSED (the ORIGINAL_DST variant, where a missing
// header would leave the connection's own address): 503, and no address a
// client names is dialled.
func TestShippedFailOpenAfterATrapStillStripsTheDestinationHeader(t *testing.T) {
	for _, file := range []string{"standalone/envoy.yaml", "standalone/envoy-original-dst.yaml"} {
		t.Run(file, func(t *testing.T) {
			d1, d2, attacker := newEngine(t), newEngine(t), newEngine(t)
			remap := map[string]string{"10.0.0.11:8000": d1.addr(), "10.0.0.12:8000": d2.addr(),
				withTestHooks: `"testHooks": true, ` + withTestHooks}
			b := &bootstrapv3.Bootstrap{}
			if err := manifests.DecodeEnvoyYAML(file, read(t, file), b); err != nil {
				t.Fatal(err)
			}
			cfg, err := wasmhost.ConfigFromBootstrap(b, "inference", remap)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.FailOpen == cfg.OriginalDst || !slices.Contains(cfg.RemoveRequestHeaders, cfg.DestinationHeader) {
				t.Fatalf("%s: fail open %v (ORIGINAL_DST %v), headers removed before the filters %v: the shipped defence is gone", file, cfg.FailOpen, cfg.OriginalDst, cfg.RemoveRequestHeaders)
			}
			want := 200
			if !cfg.FailOpen {
				want = 503
			}
			cfg.Module, cfg.Workers = testenv.Module(t), 1
			h, url := wasmhosttest.Start(t, cfg)

			body := `{"model":"llama-3-8b","prompt":"hi"}`
			if code, resp := post(t, url+"/v1/completions", body, map[string]string{"x-kvroute-test-panic": "trap"}); code != want {
				t.Fatalf("the trapping request: %d %s, want %d", code, resp, want)
			}
			if h.VMFailures() != 1 {
				t.Fatalf("VM failures %d, want 1", h.VMFailures())
			}
			routed := h.CounterValue("kvroute.router.requests.routed")
			steer := d1.addr()
			if cfg.OriginalDst {
				steer = attacker.addr()
			}
			for i := 0; i < 8; i++ {
				if code, resp := post(t, url+"/v1/completions", body, map[string]string{cfg.DestinationHeader: steer}); code != want {
					t.Errorf("request %d on the dead VM: %d %s, want %d", i, code, resp, want)
				}
			}
			if got := h.CounterValue("kvroute.router.requests.routed"); got != routed {
				t.Errorf("the dead filter routed %d requests", got-routed)
			}
			if n := attacker.requests.Load(); n != 0 {
				t.Errorf("the client-named address was dialled %d times", n)
			}
			if n := d1.chosen.Load() + d2.chosen.Load(); n != 0 {
				t.Errorf("%d requests reached an engine with the client's destination header", n)
			}
			if served := d1.requests.Load() + d2.requests.Load(); cfg.FailOpen && served != 9 {
				t.Errorf("engines served %d requests, want 9 (the trapping one and 8 by the fallback policy)", served)
			}
		})
	}
}
