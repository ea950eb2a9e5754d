package filter

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/snapshot"
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
		if code, resp, _ := testenv.Call(t, "POST", url+"/.kvroute/v1/state", body, auth); code != 200 {
			t.Fatalf("push: %d %s", code, resp)
		}
	}
	send := func(n int) map[string]int {
		before := h.UpstreamRequests()
		for i := range n {
			body := fmt.Sprintf(`{"model":"m","prompt":"question %d %s","max_tokens":2}`, i, strings.Repeat("x ", 20))
			if code, resp, _ := testenv.Call(t, "POST", url+"/v1/completions", body, nil); code != 200 {
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
	push := func(extra string) {
		t.Helper()
		time.Sleep(2 * time.Millisecond) // a newer stamp than the state in force
		st := fmt.Sprintf(`{"version":1,"timestampMs":%d,"hosts":[{"address":%q},{"address":%q}]%s}`, time.Now().UnixMilli(), addrs[0], addrs[1], extra)
		if code, r, _ := testenv.Call(t, "POST", url+"/.kvroute/v1/state", st, auth); code != 200 {
			t.Fatalf("push: %d %s", code, r)
		}
	}
	predicted := func() (int64, string) { t.Helper(); return predictedCached(t, h, url, body) }

	push(fmt.Sprintf(`,"gateways":[{"gateway":"other","timestampMs":%d,"routes":[{"address":%q,"chain":%q,"promptTokens":%d}]}]`,
		time.Now().UnixMilli(), addrs[0], chainBase64(chain), n))
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
	push(fmt.Sprintf(`,"removals":[{"address":%q,"from":%d,"chain":%q}]`, addrs[0], cut, chainBase64(chain)))
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
	push(fmt.Sprintf(`,"removals":[{"address":%q,"from":%d,"chain":%q}]`, addrs[0], cut, chainBase64(chain)))
	if again, _ := predicted(); !near(again, part) {
		t.Fatalf("the same removal twice: predicted %d, want %d as after the first", again, part)
	}
	push(fmt.Sprintf(`,"removals":[{"address":%q,"from":0,"chain":%q}]`, addrs[0], chainBase64(chain)))
	if none, _ := predicted(); none != 0 {
		t.Fatalf("after engine 0 evicted the whole chain: predicted %d cached tokens, want 0", none)
	}
}

// One report per gateway per interval, whatever its workers: workers
// append their routes to the gateway's ring (shared data); the holder of
// the report lease takes everything gathered since the last report, once;
// no other worker reports while the lease holds; when its holder stops,
// the lease expires and another worker takes over with the routes left.
func TestReportLeaseOneReporterPerGateway(t *testing.T) {
	store := &index.MemStore{}
	a := &reporter{gateway: "g", worker: 1, store: store}
	b := &reporter{gateway: "g", worker: 2, store: store}
	routes := func(r *reporter, from, to uint64) int {
		body := r.appendRing(nil, from, to)
		if len(body) == 0 {
			return 0
		}
		var rs []snapshot.Route
		if err := json.Unmarshal(append(append([]byte{'['}, body...), ']'), &rs); err != nil {
			t.Fatalf("ring entries are not route objects: %v: %s", err, body)
		}
		return len(rs)
	}
	const interval = 50
	now := int64(1_000_000)
	a.addRoute("10.0.0.1:8000", []uint64{1, 2}, 32, 0)
	b.addRoute("10.0.0.2:8000", []uint64{3}, 16, 0)
	b.addRoute("10.0.0.2:8000", []uint64{4}, 16, 0)
	a.flush()
	b.flush()
	from, to, ok := a.take(now, interval)
	if !ok || routes(a, from, to) != 3 {
		t.Fatalf("the first worker's report: ok %v, entries [%d, %d)", ok, from, to)
	}
	if _, _, ok := b.take(now+1, interval); ok {
		t.Fatal("a second worker reported while the lease holds")
	}
	a.addRoute("10.0.0.1:8000", []uint64{5}, 16, 0)
	a.flush()
	if _, _, ok := a.take(now+interval-1, interval); ok {
		t.Fatal("reported again within the interval")
	}
	from, to, ok = a.take(now+interval, interval)
	if !ok || routes(a, from, to) != 1 {
		t.Fatalf("the next interval's report: ok %v, %d routes", ok, routes(a, from, to))
	}
	// a stops (its VM is gone): b's routes wait in the ring until the
	// lease expires, then b reports them.
	b.addRoute("10.0.0.2:8000", []uint64{6}, 16, 0)
	b.flush()
	last := now + interval
	if _, _, ok := b.take(last+interval, interval); ok {
		t.Fatal("another worker took a live lease")
	}
	from, to, ok = b.take(last+2*interval+reportLeaseMs+1, interval)
	if !ok || routes(b, from, to) != 1 {
		t.Fatalf("after the holder stopped: ok %v, %d routes, want its successor to report 1", ok, routes(b, from, to))
	}
	if _, _, ok := a.take(last+2*interval+reportLeaseMs+2, interval); ok {
		t.Fatal("the old holder reported on its successor's lease")
	}
}

// An entry claimed but not yet written (its worker between the CAS on the
// sequence and the write) holds the next report back once, then is
// skipped; entries overwritten before a report (the ring wrapped) are
// counted as dropped, not sent twice or garbled.
func TestReportRingStuckAndWrapped(t *testing.T) {
	store := &index.MemStore{}
	r := &reporter{gateway: "g", worker: 1, store: store}
	r.addRoute("10.0.0.1:8000", []uint64{1}, 16, 0)
	r.flush()
	// Another worker claims seq 1 and has not written it yet.
	_ = store.Set(reportSeqKey, binary.LittleEndian.AppendUint64(nil, 2), 0)
	if end := r.ringEnd(0); end != 1 {
		t.Fatalf("ring end %d, want 1 (entry 1 claimed, not written)", end)
	}
	if end := r.ringEnd(1); end != 2 {
		t.Fatalf("ring end %d, want 2 (entry 1 skipped the second time)", end)
	}
	for range reportRingSlots + 3 {
		r.addRoute("10.0.0.1:8000", []uint64{7}, 16, 0)
		r.flush()
	}
	to := r.ringEnd(2)
	if to != 2+reportRingSlots+3 {
		t.Fatalf("ring end %d, want %d", to, 2+reportRingSlots+3)
	}
	body := r.appendRing(nil, 2, to)
	if n := strings.Count(string(body), `"address"`); n != reportRingSlots || r.dropped != 3 {
		t.Fatalf("%d routes sent and %d dropped, want %d and 3", n, r.dropped, reportRingSlots)
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
