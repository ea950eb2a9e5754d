package metricsvc

import (
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/metricsvc/discovery"
	"github.com/kvroute/kvroute/internal/metricsvc/push"
)

// A gateway URL a push cannot reach, or that would reach an engine instead
// of the gateway's state path, stops the service at start with the reason.
func TestNewRefusesGatewayURLsAPushCannotUse(t *testing.T) {
	src := &switchSource{ch: make(chan []discovery.Endpoint)}
	for _, tc := range []struct{ url, want string }{
		{"not-a-url", "scheme must be http or https"},
		{"gw:9002/.kvroute/v1/state", "scheme must be http or https"},
		{"ftp://gw/.kvroute/v1/state", "scheme must be http or https"},
		{"http:///.kvroute/v1/state", "no host"},
		{"http://gw:9002", "no path"},
		{"http://gw:9002/", "no path"},
		{"http://u:p@gw/.kvroute/v1/state", "credentials"},
		{"http://gw:9002/%zz", "not a URL"},
	} {
		_, err := New(Config{Source: src, Gateways: []string{tc.url}, Token: push.StaticToken("tok")})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "e.g. http") && tc.want != "credentials" {
			t.Errorf("%q: %v, want an error saying %q and an example", tc.url, err, tc.want)
		}
	}
	if _, err := New(Config{Source: src, Gateways: []string{"https://gw-0.gw:9002/.kvroute/v1/state"}, Token: push.StaticToken("tok")}); err != nil {
		t.Errorf("a good URL: %v", err)
	}
}

// /healthz reports pushes failing: 503 when every gateway refuses them
// (here a wrong token), 200 "degraded" when some still take them. /livez,
// the liveness probe, stays 200: a restart would fix neither.
func TestHealthzReportsPushesFailing(t *testing.T) {
	e := newFakeEngine(t, vllmText(0, 0))
	good, bad := newGateway(t, "tok"), newGateway(t, "other")
	for _, tc := range []struct {
		name     string
		gateways []string
		code     int
		status   string
	}{
		{"every gateway failing", []string{bad.url()}, 503, `"status":"pushes_failing"`},
		{"one of two failing", []string{good.url(), bad.url()}, 200, `"status":"degraded"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &switchSource{ch: make(chan []discovery.Endpoint, 1)}
			src.ch <- []discovery.Endpoint{{Address: e.addr()}}
			_, _, admin := startService(t, Config{Source: src, ScrapeInterval: 20 * time.Millisecond, ScrapeTimeout: time.Second,
				PushInterval: 20 * time.Millisecond, Gateways: tc.gateways, Token: push.StaticToken("tok")})
			var code int
			var body string
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				code, body = get(t, admin+"/healthz")
				if code == tc.code && strings.Contains(body, tc.status) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("/healthz = %d %s, want %d with %s", code, body, tc.code, tc.status)
				}
			}
			if !strings.Contains(body, `"failing":true`) || !strings.Contains(body, "401") {
				t.Errorf("/healthz does not name the failing gateway and its error: %s", body)
			}
			if code, body := get(t, admin+"/livez"); code != 200 {
				t.Errorf("/livez = %d %s, want 200", code, body)
			}
		})
	}
}
