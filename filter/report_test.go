package filter

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/openai"
)

// Load stays honest across gateways: a push carrying another gateway's
// load picture (snapshot.State.Gateways) makes the router count that
// gateway's requests on each host. With another gateway holding 50
// requests on engine 0, least_request sends every request elsewhere; the
// same push without the picture spreads them over both engines.
func TestWasmOtherGatewaysLoadCounts(t *testing.T) {
	addrs := jsonUpstreams(t, 2, `{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":5,"completion_tokens":1}}`)
	h, url := startRouter(t, addrs, 2, `,"fallbacks":0,"strategy":"least_request","state":{"token":"`+stateToken+`"}`)
	auth := map[string]string{"authorization": "Bearer " + stateToken}
	push := func(gateways string) {
		t.Helper()
		now := time.Now().UnixMilli()
		body := fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[{"address":%q},{"address":%q}]%s}`, now, addrs[0], addrs[1], gateways)
		if code, resp, _ := call(t, "POST", url+"/.kvroute/v1/state", body, auth); code != 200 {
			t.Fatalf("push: %d %s", code, resp)
		}
	}
	send := func(n int) map[string]int {
		before := h.UpstreamRequests()
		for i := range n {
			body := fmt.Sprintf(`{"model":"m","prompt":"question %d %s","max_tokens":2}`, i, strings.Repeat("x ", 20))
			if code, resp, _ := call(t, "POST", url+"/v1/completions", body, nil); code != 200 {
				t.Fatalf("request %d: %d %s", i, code, resp)
			}
		}
		after := h.UpstreamRequests()
		return map[string]int{addrs[0]: after[addrs[0]] - before[addrs[0]], addrs[1]: after[addrs[1]] - before[addrs[1]]}
	}
	push(fmt.Sprintf(`,"gateways":[{"gateway":"other","timestampMs":%d,"load":[{"address":%q,"inFlight":50,"prefillTokens":0,"decodeTokens":0}]}]`, time.Now().UnixMilli(), addrs[0]))
	if got := send(10); got[addrs[0]] != 0 {
		t.Fatalf("another gateway holds 50 requests on engine 0, yet it got %d of 10 (%v)", got[addrs[0]], got)
	}
	time.Sleep(2 * time.Millisecond)
	push("")
	if got := send(10); got[addrs[0]] == 0 {
		t.Fatalf("without the other gateway's load engine 0 got none of 10 (%v)", got)
	}
}

// An engine's eviction, pushed as a removal (snapshot.State.Removals),
// truncates that host's chain in the gateway's index: the prediction for
// the same prompt on that host drops to the blocks before the cut. The
// chain reached the index as another gateway's route, as in production.
func TestWasmPushedRemovalTruncatesChain(t *testing.T) {
	prompt := strings.Repeat("the quick brown fox jumps over the lazy dog ", 100)
	body := `{"model":"m","prompt":"` + prompt + `","max_tokens":2}`
	n := len(prompt) / 4
	// The engine confirms the whole prompt cached: never fewer tokens
	// than predicted, so cached_tokens never corrects the index here.
	resp := fmt.Sprintf(`{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`, n, n)
	addrs := jsonUpstreams(t, 2, resp)
	h, url := startRouter(t, addrs, 1, `,"fallbacks":0,"strategy":"kv_cache_aware","state":{"token":"`+stateToken+`"}`)
	auth := map[string]string{"authorization": "Bearer " + stateToken}

	p := newParser(t, `{}`)
	if _, err := p.Parse([]byte(body), openai.Completions); err != nil {
		t.Fatal(err.Message)
	}
	chain := p.Hasher().Blocks()
	if len(chain) < 8 {
		t.Fatalf("the prompt makes %d blocks; the test needs 8 or more", len(chain))
	}
	b64 := func(c []uint64) string {
		var raw []byte
		for _, x := range c {
			raw = binary.LittleEndian.AppendUint64(raw, x)
		}
		return base64.StdEncoding.EncodeToString(raw)
	}
	push := func(extra string) {
		t.Helper()
		time.Sleep(2 * time.Millisecond) // a newer stamp than the state in force
		st := fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[{"address":%q},{"address":%q}]%s}`, time.Now().UnixMilli(), addrs[0], addrs[1], extra)
		if code, r, _ := call(t, "POST", url+"/.kvroute/v1/state", st, auth); code != 200 {
			t.Fatalf("push: %d %s", code, r)
		}
	}
	predicted := func() (int64, string) {
		t.Helper()
		before := h.CounterValue("kvroute.router.feedback.predicted_cached_tokens")
		responses := h.CounterValue("kvroute.router.feedback.responses")
		served := h.UpstreamRequests()
		if code, r, _ := call(t, "POST", url+"/v1/completions", body, nil); code != 200 {
			t.Fatalf("request: %d %s", code, r)
		}
		var to string
		for a, c := range h.UpstreamRequests() {
			if c > served[a] {
				to = a
			}
		}
		// The stream ends, and its feedback is counted, after the reply.
		testenv.WaitFor(t, "the response's feedback", func() bool { return h.CounterValue("kvroute.router.feedback.responses") > responses })
		return h.CounterValue("kvroute.router.feedback.predicted_cached_tokens") - before, to
	}

	push(fmt.Sprintf(`,"gateways":[{"gateway":"other","timestampMs":%d,"routes":[{"address":%q,"chain":%q,"promptTokens":%d}]}]`,
		time.Now().UnixMilli(), addrs[0], b64(chain), n))
	whole, to := predicted()
	if to != addrs[0] || whole <= 0 {
		t.Fatalf("after another gateway's route to engine 0: served by %s, predicted %d cached tokens; want engine 0, > 0", to, whole)
	}
	// (Tokens are characters over the calibrated characters per token,
	// which moves a little from one response to the next: 2 % slack.)
	near := func(a, b int64) bool { return 50*(a-b) <= b && 50*(b-a) <= b }
	if again, _ := predicted(); !near(again, whole) {
		t.Fatalf("without a removal the prediction fell from %d to %d", whole, again)
	}

	cut := len(chain) / 2
	push(fmt.Sprintf(`,"removals":[{"address":%q,"from":%d,"chain":%q}]`, addrs[0], cut, b64(chain)))
	if v := h.CounterValue("kvroute.router.state.removals_applied"); v != 1 {
		t.Fatalf("state.removals_applied = %d, want 1", v)
	}
	part, to := predicted()
	if to != addrs[0] || part <= 0 || part > whole*3/4 {
		t.Fatalf("after engine 0 evicted the chain from block %d of %d: served by %s, predicted %d (whole chain: %d); want engine 0, between 0 and the whole", cut, len(chain), to, part, whole)
	}
	// The same removal again (a second service replica) changes nothing
	// more: the request just routed re-recorded the chain, so it is cut
	// again to the same depth.
	push(fmt.Sprintf(`,"removals":[{"address":%q,"from":%d,"chain":%q}]`, addrs[0], cut, b64(chain)))
	if again, _ := predicted(); !near(again, part) {
		t.Fatalf("the same removal twice: predicted %d, want %d as after the first", again, part)
	}
	push(fmt.Sprintf(`,"removals":[{"address":%q,"from":0,"chain":%q}]`, addrs[0], b64(chain)))
	if none, _ := predicted(); none != 0 {
		t.Fatalf("after engine 0 evicted the whole chain: predicted %d cached tokens, want 0", none)
	}
}

// newParser is the router's request parser under the configuration cfgJSON.
func newParser(t testing.TB, cfgJSON string) *openai.Parser {
	cfg, err := config.Parse([]byte(cfgJSON))
	if err != nil {
		t.Fatal(err)
	}
	p := openai.NewParser(cfg, index.NewHasher(index.HashConfig{}))
	return &p
}
