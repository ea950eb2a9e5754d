package envoy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"

	"github.com/kvroute/kvroute/internal/deploy/manifests"
	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/internal/testenv/wasmhosttest"
)

// These tests run the shipped standalone bootstraps, unedited, with the real
// dist/kvroute.wasm in internal/sim/wasmhost (the Envoy-faithful host): the
// listener's filter chain, clusters, header and limits come from the
// manifest, and only the engine addresses are pointed at loopback upstreams.

type engine struct {
	srv *httptest.Server
	// reply, when set, is the JSON body answered (default: a completion).
	reply     string
	lastBody  atomic.Value // string
	requests  atomic.Int64
	bodyBytes atomic.Int64
	// chosen counts requests whose destination header names this engine
	// (first, or as a fallback after addresses outside the cluster): the
	// filter chose it and the cluster honoured the choice.
	chosen atomic.Int64
}

func newEngine(t *testing.T) *engine {
	e := &engine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		n := int64(len(body))
		e.lastBody.Store(string(body))
		e.requests.Add(1)
		for _, a := range strings.Split(r.Header.Get("x-gateway-destination-endpoint"), ",") {
			if strings.TrimSpace(a) == e.addr() {
				e.chosen.Add(1)
				break
			}
		}
		e.bodyBytes.Add(n)
		w.Header().Set("content-type", "application/json")
		if e.reply != "" {
			io.WriteString(w, e.reply)
			return
		}
		io.WriteString(w, `{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *engine) addr() string { return strings.TrimPrefix(e.srv.URL, "http://") }

func startManifest(t *testing.T, file, listener string, remap map[string]string) (*wasmhost.Host, string) {
	t.Helper()
	b := &bootstrapv3.Bootstrap{}
	if err := manifests.DecodeEnvoyYAML(file, read(t, file), b); err != nil {
		t.Fatal(err)
	}
	cfg, err := wasmhost.ConfigFromBootstrap(b, listener, remap)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Module = testenv.Module(t)
	return wasmhosttest.Start(t, cfg) // fails with the module's log when it refuses the shipped configuration
}

func post(t *testing.T, url, body string, hdr map[string]string) (int, string) {
	t.Helper()
	code, resp, _ := testenv.Call(t, "POST", url, body, hdr)
	return code, resp
}

func TestShippedBootstrapRunsWithTheModule(t *testing.T) {
	d1, d2, prefill, attacker := newEngine(t), newEngine(t), newEngine(t), newEngine(t)
	h, url := startManifest(t, "standalone/envoy.yaml", "inference", map[string]string{
		"10.0.0.11:8000": d1.addr(), "10.0.0.12:8000": d2.addr(), "10.0.0.21:8000": prefill.addr(),
	})
	const n = 24
	for i := 0; i < n; i++ {
		hdr := map[string]string{}
		if i%2 == 1 { // a client trying to steer, to an address outside the fleet
			hdr["x-gateway-destination-endpoint"] = attacker.addr()
		}
		body := fmt.Sprintf(`{"model":"llama-3-8b","messages":[{"role":"user","content":"question %d"}]}`, i)
		if code, resp := post(t, url+"/v1/chat/completions", body, hdr); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, resp)
		}
	}
	if got := d1.requests.Load() + d2.requests.Load(); got != n {
		t.Errorf("decode engines served %d of %d requests", got, n)
	}
	if d1.requests.Load() == 0 || d2.requests.Load() == 0 {
		t.Errorf("one decode engine got nothing: %d / %d", d1.requests.Load(), d2.requests.Load())
	}
	if got := attacker.requests.Load(); got != 0 {
		t.Errorf("the client-named address got %d requests", got)
	}
	if got := d1.chosen.Load() + d2.chosen.Load(); got != n {
		t.Errorf("%d of %d requests arrived at an engine the filter named", got, n)
	}
	if h.VMFailures() != 0 {
		t.Errorf("VM failures with the shipped configuration: %v", h.LogsContaining("fail"))
	}

	// A long prompt (2 MiB, twice Envoy's default connection buffer limit)
	// reaches an engine whole instead of getting 413.
	big := `{"model":"llama-3-8b","prompt":"` + strings.Repeat("tok ", 512<<10) + `"}`
	before := d1.bodyBytes.Load() + d2.bodyBytes.Load()
	if code, resp := post(t, url+"/v1/completions", big, nil); code != 200 {
		t.Fatalf("2 MiB prompt: %d %.200s", code, resp)
	}
	if got := d1.bodyBytes.Load() + d2.bodyBytes.Load() - before; got != int64(len(big)) {
		t.Errorf("engine received %d of %d body bytes", got, len(big))
	}
}

func TestShippedOriginalDstBootstrapRunsWithTheModule(t *testing.T) {
	d1, d2, attacker := newEngine(t), newEngine(t), newEngine(t)
	_, url := startManifest(t, "standalone/envoy-original-dst.yaml", "inference", map[string]string{
		"10.0.0.11:8000": d1.addr(), "10.0.0.12:8000": d2.addr(),
	})
	for i := 0; i < 10; i++ {
		code, resp := post(t, url+"/v1/completions", `{"model":"llama-3-8b","prompt":"hi"}`,
			map[string]string{"x-gateway-destination-endpoint": attacker.addr()})
		if code != 200 {
			t.Fatalf("request %d: %d %s", i, code, resp)
		}
	}
	if got := d1.requests.Load() + d2.requests.Load(); got != 10 {
		t.Errorf("engines served %d of 10", got)
	}
	if got := attacker.requests.Load(); got != 0 {
		t.Errorf("ORIGINAL_DST dialled the client-named address %d times", got)
	}
}

// TestShippedStateListener pushes fleet state to the shipped state listener:
// the token comes from Envoy's environment (host_env_keys), a wrong or
// missing token is refused, the right one accepted.
func TestShippedStateListener(t *testing.T) {
	t.Setenv("KVROUTE_STATE_TOKEN", "t0ken-from-the-environment")
	_, url := startManifest(t, "standalone/envoy.yaml", "kvroute_state", nil)
	state := fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[{"address":"10.0.0.11:8000","role":"decode","healthy":true,"waiting":0,"running":1,"kvUsage":0.2}]}`, time.Now().UnixMilli())
	for _, c := range []struct {
		auth string
		want int
	}{
		{"", 401},
		{"Bearer wrong", 401},
		{"Bearer t0ken-from-the-environment", 200},
	} {
		hdr := map[string]string{}
		if c.auth != "" {
			hdr["authorization"] = c.auth
		}
		if code, resp := post(t, url+"/.kvroute/v1/state", state, hdr); code != c.want {
			t.Errorf("push with %q: %d %s, want %d", c.auth, code, resp, c.want)
		}
	}

	// Without the variable in Envoy's environment the VM has no token and
	// refuses every push, the right one included.
	t.Setenv("KVROUTE_STATE_TOKEN", "")
	_, url = startManifest(t, "standalone/envoy.yaml", "kvroute_state", nil)
	if code, resp := post(t, url+"/.kvroute/v1/state", state, map[string]string{"authorization": "Bearer t0ken-from-the-environment"}); code != 401 {
		t.Errorf("push to a VM without the token variable: %d %s, want 401", code, resp)
	}
}

// TestShippedBootstrapDisaggregates sends a long prompt through the shipped
// bootstrap: the router picks a prefill host (disaggregation threshold 512
// tokens), kvroute.pd calls it through the kvroute_prefill cluster, and the
// decode engine receives the prefill's kv_transfer_params untouched. This is
// the wiring the manifest is responsible for: pd.prefillCluster names a
// cluster with override_host on the destination header.
func TestShippedBootstrapDisaggregates(t *testing.T) {
	d1, d2, prefill := newEngine(t), newEngine(t), newEngine(t)
	const params = `{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"prefill-0","remote_block_ids":[1,2,3],"remote_host":"10.9.9.9","remote_port":5600}`
	prefill.reply = `{"id":"p","choices":[{"text":"x"}],"kv_transfer_params":` + params + `}`
	_, url := startManifest(t, "standalone/envoy.yaml", "inference", map[string]string{
		"10.0.0.11:8000": d1.addr(), "10.0.0.12:8000": d2.addr(), "10.0.0.21:8000": prefill.addr(),
	})
	prompt := strings.Repeat("the quick brown fox jumps over the lazy dog ", 300) // ~2700 words
	code, resp := post(t, url+"/v1/completions", `{"model":"llama-3-8b","prompt":"`+prompt+`","max_tokens":16}`, nil)
	if code != 200 {
		t.Fatalf("%d %.200s", code, resp)
	}
	if prefill.requests.Load() != 1 || prefill.chosen.Load() != 1 {
		t.Fatalf("prefill engine: %d requests (%d naming it); want the one prefill callout", prefill.requests.Load(), prefill.chosen.Load())
	}
	pbody, _ := prefill.lastBody.Load().(string)
	if !strings.Contains(pbody, `"max_tokens":1`) || !strings.Contains(pbody, `"do_remote_decode":true`) {
		t.Errorf("prefill request is not a vLLM prefill-only request: %.300s", pbody)
	}
	var decoded string
	for _, d := range []*engine{d1, d2} {
		if d.requests.Load() == 1 {
			decoded, _ = d.lastBody.Load().(string)
		}
	}
	if !strings.Contains(decoded, `"kv_transfer_params":`+params) {
		t.Errorf("decode request lacks the prefill's kv_transfer_params byte for byte: %.300s", decoded[max(0, len(decoded)-400):])
	}
}
