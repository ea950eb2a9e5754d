package filter

import (
	"strings"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/filter/config"
)

// routerPlugin is the kvroute.router root.
type routerPlugin struct {
	cfg   *config.Config
	stats routerStats
	rr    sharedCounter
}

type routerStats struct {
	commonStats
	routed      proxywasm.MetricCounter // destination header set
	noEndpoints proxywasm.MetricCounter // nothing to route to: Envoy's fallback policy picks
	failedOpen  proxywasm.MetricCounter // a recovered panic sent the request on a safe route
}

func newRouter(cfg *config.Config) (*routerPlugin, error) {
	p := &routerPlugin{cfg: cfg}
	p.stats = routerStats{
		commonStats: newCommonStats("router"),
		routed:      proxywasm.DefineCounterMetric("kvroute.router.requests.routed"),
		noEndpoints: proxywasm.DefineCounterMetric("kvroute.router.requests.no_endpoints"),
		failedOpen:  proxywasm.DefineCounterMetric("kvroute.router.requests.failed_open"),
	}
	p.rr = sharedCounter{key: "kvroute.router.rr", casRetries: p.stats.casRetries}
	return p, nil
}

func (p *routerPlugin) newStream(uint32) types.HttpContext { return &routerStream{plugin: p} }

func (p *routerPlugin) onTick() {}

// destinations returns the destination header value: the primary endpoint
// followed by up to cfg.Fallbacks others, in round-robin order. Envoy's
// override_host policy tries them in that order.
func (p *routerPlugin) destinations() string {
	eps := p.cfg.Endpoints
	if len(eps) == 0 {
		return ""
	}
	start := int(p.rr.next() % uint64(len(eps)))
	n := 1 + p.cfg.Fallbacks
	if n > len(eps) {
		n = len(eps)
	}
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(eps[(start+i)%len(eps)].Address)
	}
	return b.String()
}

// routerStream is one request through kvroute.router.
type routerStream struct {
	types.DefaultHttpContext
	plugin *routerPlugin
}

func (s *routerStream) OnHttpRequestHeaders(int, bool) (action types.Action) {
	p := s.plugin
	defer guard(p.stats.recoveredPanics, "kvroute.router on_request_headers", &action, s.failOpen)
	hook, err := stripRoutingHeaders(p.cfg.DestinationHeader)
	if err != nil {
		proxywasm.LogWarnf("kvroute.router: reading request headers: %v", err)
	}
	testPanic(p.cfg.TestHooks, hook)
	s.route()
	return types.ActionContinue
}

// route sets the destination header, or leaves the choice to Envoy's
// fallback policy when there is nothing to choose from.
func (s *routerStream) route() {
	p := s.plugin
	dest := p.destinations()
	if dest == "" {
		p.stats.noEndpoints.Increment(1)
		return
	}
	if err := proxywasm.ReplaceHttpRequestHeader(p.cfg.DestinationHeader, dest); err != nil {
		proxywasm.LogWarnf("kvroute.router: setting %s: %v", p.cfg.DestinationHeader, err)
		return
	}
	p.stats.routed.Increment(1)
}

// failOpen runs after a recovered panic: the client's routing headers must
// still go (a panic must not turn into an SSRF), then the request takes a
// plain round-robin route.
func (s *routerStream) failOpen() {
	s.plugin.stats.failedOpen.Increment(1)
	if _, err := stripRoutingHeaders(s.plugin.cfg.DestinationHeader); err != nil {
		return
	}
	s.route()
}
