package filter

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// A pushed endpoint with two ranks is two candidates, each with its own
// queue: the idle rank is chosen, the destination header names the
// endpoint alone and the rank header the rank; a push naming a rank the
// endpoint does not have gets 400 with the field's path. A removal names
// a rank as host:port|rank.
func TestPushedRanksRouteByRankLoad(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	host, p := newHostWith(t, Options{Clock: func() time.Time { return now }}, RootRouter, threeEndpoints+`,"fallbacks":0,"strategy":"q","profiles":{"q":{"scorers":["queue"],"picker":"max_score"}},"state":{"token":"`+stateToken+`"}}`, types.OnPluginStartStatusOK)
	push := func(body string) (int, string) {
		t.Helper()
		id, _ := send(host, "POST", "/.kvroute/v1/state", body, [2]string{"authorization", "Bearer " + stateToken})
		r := host.GetSentLocalResponse(id)
		if r == nil {
			t.Fatal("no reply to the push")
		}
		return int(r.StatusCode), string(r.Data)
	}
	body := func(busyRank int) string {
		var hs []string
		for r, w := range [2]string{"0", "0"} {
			if r == busyRank {
				w = "40"
			}
			hs = append(hs, `{"address":"10.1.0.1:8000","dataParallelSize":2,"rank":`+string(rune('0'+r))+`,"healthy":true,"waiting":`+w+`,"running":8,"kvUsage":0.2}`)
		}
		return `{"version":1,"timestampMs":` + strconv.FormatInt(now.UnixMilli(), 10) + `,"hosts":[` + strings.Join(hs, ",") + `]}`
	}
	for _, busy := range []int{0, 1} {
		if code, msg := push(body(busy)); code != 200 {
			t.Fatalf("push: %d %s", code, msg)
		}
		if len(p.hosts) != 2 {
			t.Fatalf("candidates %d, want one per rank", len(p.hosts))
		}
		id, _ := post(host, completion)
		if got := destination(host, id); got != "10.1.0.1:8000" {
			t.Errorf("busy rank %d: destination %q, want the endpoint alone", busy, got)
		}
		want := string(rune('0' + 1 - busy))
		if got, _ := header(host.GetCurrentRequestHeaders(id), DataParallelRankHeader); got != want {
			t.Errorf("busy rank %d: rank header %q, want the idle rank %s", busy, got, want)
		}
	}
	// An engine's eviction on rank 1, bridged by the metrics service,
	// names the rank's location: the push is taken and the removal
	// applied to that location.
	before := counter(t, host, "kvroute.router.state.removals_applied")
	now = now.Add(time.Millisecond)
	removal := `,"removals":[{"address":"10.1.0.1:8000|1","from":0,"chain":"AQAAAAAAAAA="}]}`
	if code, msg := push(strings.TrimSuffix(body(0), "}") + removal); code != 200 {
		t.Fatalf("push with a rank's removal: %d %s", code, msg)
	}
	if got := counter(t, host, "kvroute.router.state.removals_applied") - before; got != 1 {
		t.Errorf("state.removals_applied rose by %d for a rank's removal, want 1", got)
	}
	code, msg := push(strings.Replace(body(0), `"rank":1`, `"rank":2`, 1))
	if code != 400 || !strings.Contains(msg, "hosts[1].rank") {
		t.Errorf("a rank outside the endpoint: %d %s, want 400 naming hosts[1].rank", code, msg)
	}
}
