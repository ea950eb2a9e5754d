package filter

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
)

// loraPush is a pushed snapshot of three engines with LoRA state: the first
// full (both of its two slots taken: one adapter listed, one running
// that discovery does not declare), the second holding
// "fin-lora", the third with free slots. The two that are not full report
// othersKV of their KV cache in use (the full one none).
func loraPush(addrs []string, finAt int, othersKV float64) string {
	hosts := make([]string, 3)
	for i, a := range addrs {
		switch {
		case i == finAt:
			hosts[i] = fmt.Sprintf(`{"address":%q,"model":"llama-3-8b","adapters":["fin-lora"],"maxAdapters":2,"adapterSlotsUsed":1,"kvUsage":%g}`, a, othersKV)
		case i == 0:
			hosts[i] = fmt.Sprintf(`{"address":%q,"model":"llama-3-8b","adapters":["a"],"maxAdapters":2,"adapterSlotsUsed":2}`, a)
		default:
			hosts[i] = fmt.Sprintf(`{"address":%q,"model":"llama-3-8b","adapters":["c"],"maxAdapters":4,"adapterSlotsUsed":1,"kvUsage":%g}`, a, othersKV)
		}
	}
	return fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[%s]}`, time.Now().UnixMilli(), strings.Join(hosts, ","))
}

// The default profile sends a request naming an adapter to the engine that
// has it loaded, and when none has, away from the engine whose adapter
// slots are full; base-model requests still go to the full engine.
func TestWasmDefaultProfilePrefersLoadedAdapterAvoidsFullHost(t *testing.T) {
	addrs := jsonUpstreams(t, 3, `{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":5,"completion_tokens":1}}`)
	h, url := startRouter(t, addrs, 2, `,"fallbacks":0,"loraAdapters":{"fin-lora":"llama-3-8b"},"state":{"token":"`+stateToken+`"}`)
	auth := map[string]string{"authorization": "Bearer " + stateToken}
	send := func(model string, n int) map[string]int {
		before := h.UpstreamRequests()
		for i := 0; i < n; i++ {
			body := fmt.Sprintf(`{"model":%q,"prompt":"ticket %d: %s","max_tokens":2}`, model, i, strings.Repeat("words ", 40+i))
			if code, resp, _ := testenv.Call(t, "POST", url+"/v1/completions", body, nil); code != 200 {
				t.Fatalf("%s request %d: %d %s", model, i, code, resp)
			}
		}
		after := h.UpstreamRequests()
		got := map[string]int{}
		for _, a := range addrs {
			got[a] = after[a] - before[a]
		}
		return got
	}
	if code, body, _ := testenv.Call(t, "POST", url+"/.kvroute/v1/state", loraPush(addrs, 1, 0), auth); code != 200 {
		t.Fatalf("push: %d %s", code, body)
	}
	if got := send("fin-lora", 12); got[addrs[1]] != 12 {
		t.Errorf("fin-lora loaded on engine 1: requests per engine %v, want all 12 on %s", got, addrs[1])
	}
	// Nobody holds it now: the full engine 0 gets none.
	// The other two also have half their KV cache in use, so that engine
	// 0, with all of its free, is every request's best host but for its
	// adapter slots.
	none := strings.Replace(loraPush(addrs, 1, 0.5), `"adapters":["fin-lora"]`, `"adapters":["d"]`, 1)
	if code, body, _ := testenv.Call(t, "POST", url+"/.kvroute/v1/state", none, auth); code != 200 {
		t.Fatalf("push: %d %s", code, body)
	}
	if got := send("fin-lora", 12); got[addrs[0]] != 0 {
		t.Errorf("engine 0's adapter slots are full: it got %d of 12 fin-lora requests (%v)", got[addrs[0]], got)
	}
	// Base-model requests ignore adapter state: the full engine is a
	// candidate like any other, and the best one. (With every engine equal
	// the default picker breaks ties at random, and "engine 0 gets at least
	// one of 12" failed once in about 130 runs: (2/3)^12.)
	if got := send("llama-3-8b", 12); got[addrs[0]] != 12 {
		t.Errorf("base-model requests per engine %v: want all 12 on engine 0 (%s), the one with free KV cache, adapter slots notwithstanding", got, addrs[0])
	}
}

// An adapter nobody serves is answered as an OpenAI server answers an
// unknown model, naming what the client asked for, and counted; an adapter
// only the pushed state names (not in loraAdapters) goes to the engines
// that list it.
func TestWasmUnknownAdapterIs404(t *testing.T) {
	addrs := jsonUpstreams(t, 3, `{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":5,"completion_tokens":1}}`)
	h, url := startRouter(t, addrs, 1, `,"fallbacks":0,"loraAdapters":{"fin-lora":"llama-3-8b","orphan-lora":"llama-2-7b"},"state":{"token":"`+stateToken+`"}`)
	push := fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[
		{"address":%q,"model":"llama-3-8b"},
		{"address":%q,"model":"llama-3-8b","adapters":["pushed-lora"]},
		{"address":%q,"model":"llama-3-8b"}]}`, time.Now().UnixMilli(), addrs[0], addrs[1], addrs[2])
	if code, body, _ := testenv.Call(t, "POST", url+"/.kvroute/v1/state", push, map[string]string{"authorization": "Bearer " + stateToken}); code != 200 {
		t.Fatalf("push: %d %s", code, body)
	}
	for _, c := range []struct{ model, want string }{
		{"no-such-lora", `{"error":{"message":"The model 'no-such-lora' does not exist.","type":"invalid_request_error","param":"model","code":"model_not_found"}}`},
		// Configured, but its base model is served by nobody.
		{"orphan-lora", `{"error":{"message":"The model 'orphan-lora' does not exist.","type":"invalid_request_error","param":"model","code":"model_not_found"}}`},
	} {
		code, body, _ := testenv.Call(t, "POST", url+"/v1/completions", `{"model":"`+c.model+`","prompt":"hi","max_tokens":2}`, nil)
		if code != 404 || body != c.want {
			t.Errorf("%s: %d %s, want 404 %s", c.model, code, body, c.want)
		}
	}
	if got := h.CounterValue("kvroute.router.requests.model_not_found"); got != 2 {
		t.Errorf("requests.model_not_found = %d, want 2", got)
	}
	before := h.UpstreamRequests()
	for i := 0; i < 6; i++ {
		if code, body, _ := testenv.Call(t, "POST", url+"/v1/completions", fmt.Sprintf(`{"model":"pushed-lora","prompt":"q%d","max_tokens":2}`, i), nil); code != 200 {
			t.Fatalf("pushed-lora: %d %s", code, body)
		}
	}
	if after := h.UpstreamRequests(); after[addrs[1]]-before[addrs[1]] != 6 {
		t.Errorf("pushed-lora went to %v, want all 6 on %s, the engine listing it", after, addrs[1])
	}
	if code, body, _ := testenv.Call(t, "POST", url+"/v1/completions", `{"model":"fin-lora","prompt":"hi","max_tokens":2}`, nil); code != 200 {
		t.Errorf("fin-lora (base served): %d %s", code, body)
	}
}
