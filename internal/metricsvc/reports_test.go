package metricsvc

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/metricsvc/discovery"
	"github.com/kvroute/kvroute/internal/metricsvc/push"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/snapshot"
)

func postReport(t *testing.T, url, token, body string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+ReportsPath, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A gateway's report reaches every gateway with the next push, at once
// (not at the push interval); its routes are pushed once, its load picture
// while it is fresh; a report without the push token or malformed changes
// nothing.
func TestGatewayReportsReachEveryGateway(t *testing.T) {
	eng := newFakeEngine(t, vllmText(1, 1))
	gw1, gw2 := newGateway(t, "tok"), newGateway(t, "tok")
	_, _, admin := startService(t, Config{
		Source:         discovery.Fixed{{Address: eng.addr()}},
		ScrapeInterval: 50 * time.Millisecond,
		ScrapeTimeout:  time.Second,
		Gateways:       []string{gw1.url(), gw2.url()},
		Token:          push.StaticToken("tok"),
		PushInterval:   10 * time.Second,
	})
	gw1.waitState(t, "first", 3*time.Second, func(st snapshot.State) bool { h, _ := hostOf(st, eng.addr()); return h.Healthy })
	now := time.Now().UnixMilli()
	good := `{"gateway":"gw-a","timestampMs":` + itoa(now) + `,"routes":[{"address":"` + eng.addr() + `","from":0,"chain":"AQAAAAAAAAACAAAAAAAAAA=="}],"load":[{"address":"` + eng.addr() + `","inFlight":3,"prefillTokens":900,"decodeTokens":40}]}`
	for _, c := range []struct {
		token, body string
		want        int
	}{
		{"", good, 401},
		{"wrong", good, 401},
		{"tok", `{"gateway":"gw-a"`, 400},
		{"tok", `{"gateway":"","timestampMs":1}`, 400},
		{"tok", `{"gateway":"gw-a","timestampMs":1,"routes":[{"address":"x:1","chain":"AQID"}]}`, 400},
	} {
		if got := postReport(t, admin, c.token, c.body); got != c.want {
			t.Errorf("token %q body %.40q: status %d, want %d", c.token, c.body, got, c.want)
		}
	}
	sent := time.Now()
	if got := postReport(t, admin, "tok", good); got != http.StatusNoContent {
		t.Fatalf("good report: status %d", got)
	}
	for _, gw := range []*gateway{gw1, gw2} {
		st := gw.waitState(t, "the report", 2*time.Second, func(st snapshot.State) bool { return len(st.Gateways) > 0 })
		var routes, loads int
		for _, r := range st.Gateways {
			if r.Gateway != "gw-a" {
				t.Fatalf("pushed a report of %q", r.Gateway)
			}
			routes += len(r.Routes)
			for _, l := range r.Load {
				if l.InFlight == 3 && l.PrefillTokens == 900 {
					loads++
				}
			}
		}
		if routes != 1 || loads != 1 {
			t.Fatalf("push carries %d routes and %d load pictures, want 1 and 1: %+v", routes, loads, st.Gateways)
		}
	}
	t.Logf("the report reached both gateways %v after it was sent (push interval 10 s)", time.Since(sent))
	// The next push (a queue change) carries the load picture, not the route again.
	eng.text.Store(vllmText(5, 1))
	st := gw1.waitState(t, "change", 3*time.Second, func(st snapshot.State) bool { h, _ := hostOf(st, eng.addr()); return h.Waiting == 5 })
	for _, r := range st.Gateways {
		if len(r.Routes) > 0 {
			t.Fatal("a route was pushed twice")
		}
	}
	if len(st.Gateways) != 1 || len(st.Gateways[0].Load) != 1 {
		t.Fatalf("the load picture is not in the next push: %+v", st.Gateways)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// A report retried after a lost answer (the same gateway and seq) is taken
// once: its routes are pushed once. Reports not numbered (seq 0) are all
// taken; a gateway that stops reporting is forgotten with its load picture.
func TestReportRetriedIsTakenOnce(t *testing.T) {
	var b reportBook
	now := time.Now()
	rep := func(gw string, seq uint64) snapshot.GatewayReport {
		return snapshot.GatewayReport{Gateway: gw, TimestampMs: now.UnixMilli(), Seq: seq,
			Routes: []snapshot.Route{{Address: "10.0.0.1:8000", Chain: "AQAAAAAAAAA="}},
			Load:   []snapshot.HostLoad{{Address: "10.0.0.1:8000", InFlight: 1}}}
	}
	b.add(rep("a", 7))
	b.add(rep("a", 7)) // the retry
	b.add(rep("a", 8))
	b.add(rep("b", 7)) // another gateway's seq 7
	b.add(rep("c", 0))
	b.add(rep("c", 0))
	out, _ := b.take(now)
	routes := 0
	for _, r := range out {
		routes += len(r.Routes)
	}
	if routes != 5 || b.Duplicates != 1 || b.Received != 5 {
		t.Fatalf("pushed %d routes, %d duplicates, %d received; want 5, 1, 5", routes, b.Duplicates, b.Received)
	}
	b.take(now.Add(2 * loadFresh))
	if len(b.seen) != 0 {
		t.Fatalf("gateways gone for %v still remembered: %v", 2*loadFresh, b.seen)
	}
	b.add(rep("a", 7))
	if b.Received != 6 {
		t.Fatalf("a gateway back after it was forgotten: its report was refused")
	}
}

// A gateway that missed pushes (failing while two reports went out, each
// in a push of its own) gets both reports' routes once it takes pushes
// again, not only the last push's: routes go out once, and the pusher
// keeps only the newest snapshot per gateway.
func TestGatewayThatMissedPushesGetsTheirRoutes(t *testing.T) {
	eng := newFakeEngine(t, vllmText(1, 1))
	gw := newGateway(t, "tok")
	svc, _, admin := startService(t, Config{
		Source:         discovery.Fixed{{Address: eng.addr()}},
		ScrapeInterval: 50 * time.Millisecond,
		ScrapeTimeout:  time.Second,
		Gateways:       []string{gw.url()},
		Token:          push.StaticToken("tok"),
		PushInterval:   10 * time.Second,
	})
	gw.waitState(t, "the first push", 3*time.Second, func(st snapshot.State) bool { h, _ := hostOf(st, eng.addr()); return h.Healthy })
	routed := func(sts ...snapshot.State) map[string]bool {
		m := map[string]bool{}
		for _, st := range sts {
			for _, r := range st.Gateways {
				if len(r.Routes) > 0 {
					m[r.Gateway] = true
				}
			}
		}
		return m
	}
	report := func(gateway, chain string) {
		t.Helper()
		body := `{"gateway":"` + gateway + `","timestampMs":` + itoa(time.Now().UnixMilli()) + `,"routes":[{"address":"` + eng.addr() + `","from":0,"chain":"` + chain + `"}]}`
		if got := postReport(t, admin, "tok", body); got != http.StatusNoContent {
			t.Fatalf("report: status %d", got)
		}
		testenv.WaitFor(t, gateway+"'s routes published", func() bool { return routed(svc.Snapshot())[gateway] })
	}
	_, before := gw.latest()
	gw.status.Store(http.StatusServiceUnavailable)
	report("gw-a", "AQAAAAAAAAA=")
	report("gw-b", "AgAAAAAAAAA=")
	gw.status.Store(0)
	var after map[string]bool
	testenv.WaitFor(t, "gw-b's routes at the gateway", func() bool {
		gw.mu.Lock()
		after = routed(gw.accepted[before:]...)
		gw.mu.Unlock()
		return after["gw-b"]
	})
	if !after["gw-a"] {
		t.Fatalf("the gateway took pushes again and got routes of %v, not gw-a's, which went out while it failed", after)
	}
}
