package filter

import (
	"fmt"
	"strings"
	"testing"
	"time"
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
