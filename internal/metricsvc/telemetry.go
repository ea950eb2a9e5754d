package metricsvc

import (
	"net/http"
	"regexp"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute/internal/metricsvc/scrape"
	"github.com/kvroute/kvroute/snapshot"
)

// telemetry is the service's own /metrics. Counters that the sub-packages
// keep themselves (KV event trackers, gateway delivery) are read at
// collection time by a custom collector, so those packages stay free of
// Prometheus.
type telemetry struct {
	reg              *prometheus.Registry
	scrapes          *prometheus.CounterVec
	scrapeDuration   prometheus.Histogram
	discoveryUpdates prometheus.Counter
	snapshots        *prometheus.CounterVec
	hosts            *prometheus.GaugeVec
}

func newTelemetry(s *Service) *telemetry {
	t := &telemetry{
		reg: prometheus.NewRegistry(),
		scrapes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_metrics_scrapes_total",
			Help: "Engine scrapes by host and result (ok, or the failure reason: connect, timeout, status, parse, not_engine, too_large).",
		}, []string{"host", "result"}),
		scrapeDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvroute_metrics_scrape_duration_seconds",
			Help:    "Duration of engine scrapes, successful or not.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
		discoveryUpdates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_metrics_discovery_updates_total",
			Help: "Endpoint sets received from discovery.",
		}),
		snapshots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_metrics_snapshots_published_total",
			Help: "Snapshots handed to the gateways, by trigger (change or interval).",
		}, []string{"trigger"}),
		hosts: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvroute_metrics_hosts",
			Help: "Engines in the last published snapshot, by health.",
		}, []string{"health"}),
	}
	t.reg.MustRegister(t.collectors(s)...)
	return t
}

// collectors is every collector the service registers.
func (t *telemetry) collectors(s *Service) []prometheus.Collector {
	return []prometheus.Collector{t.scrapes, t.scrapeDuration, t.discoveryUpdates, t.snapshots, t.hosts,
		&pullCollector{s: s},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})}
}

// Family is one metric family the service's /metrics can expose.
type Family struct {
	Name   string
	Labels []string
}

// descFields reads a Desc's name and variable labels from its String form,
// the only public view of them.
var descFields = regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)

// Families lists every metric family the service registers, its own and
// the Go runtime's, read from the collectors' descriptions: what a
// dashboard may query (the Grafana dashboard's check reads it).
func Families() []Family {
	t := newTelemetry(&Service{})
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		for _, c := range t.collectors(nil) {
			c.Describe(ch)
		}
		close(ch)
	}()
	var out []Family
	for d := range ch {
		m := descFields.FindStringSubmatch(d.String())
		if m == nil {
			continue
		}
		f := Family{Name: m[1]}
		for _, l := range strings.Split(m[2], ",") {
			if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
				f.Labels = append(f.Labels, l)
			}
		}
		out = append(out, f)
	}
	return out
}

func (t *telemetry) handler() http.Handler {
	return promhttp.HandlerFor(t.reg, promhttp.HandlerOpts{})
}

func (t *telemetry) observeScrape(r scrape.Result) {
	res := r.Reason
	if r.Err == nil {
		res = "ok"
	}
	t.scrapes.WithLabelValues(r.Address, res).Inc()
	t.scrapeDuration.Observe(r.Duration.Seconds())
}

// forget drops a removed engine's series.
func (t *telemetry) forget(addr string) {
	t.scrapes.DeletePartialMatch(prometheus.Labels{"host": addr})
}

func (t *telemetry) published(st snapshot.State, changed bool) {
	trigger := "interval"
	if changed {
		trigger = "change"
	}
	t.snapshots.WithLabelValues(trigger).Inc()
	healthy := 0
	for _, h := range st.Hosts {
		if h.Healthy {
			healthy++
		}
	}
	t.hosts.WithLabelValues("healthy").Set(float64(healthy))
	t.hosts.WithLabelValues("unhealthy").Set(float64(len(st.Hosts) - healthy))
}

var (
	descKV = prometheus.NewDesc("kvroute_metrics_kv_events_total",
		"KV event subscription counters by host and kind: batches, events, clears, gaps (left after replay), missed_batches, replayed_batches, restarts, decode_errors, unknown_events, overflow, unknown_rank (batches naming a data-parallel rank the engine's metrics do not show; on rank 0's series). A data-parallel rank above 0 is host:port|rank.",
		[]string{"host", "kind"}, nil)
	descCached = prometheus.NewDesc("kvroute_metrics_kv_cached_blocks",
		"GPU blocks each engine reported stored and not removed (KV events).", []string{"host"}, nil)
	descKVUp = prometheus.NewDesc("kvroute_metrics_kv_events_connected",
		"1 while the KV event subscription to the engine is connected.", []string{"host"}, nil)
	descBridge = prometheus.NewDesc("kvroute_metrics_cache_state_bridge_total",
		"The cache-state bridge's counters by host and kind (docs/cache-state.md): routes (reported to the host), expired (waited past the window), matched and unmatched (BlockStored events attributed to a route or to none), removed and unmapped (engine blocks removed that mapped to a chain or to none).",
		[]string{"host", "kind"}, nil)
	descListen = prometheus.NewDesc("kvroute_metrics_kv_events_listener_messages_total",
		"Messages the KV event listener (--kv-events-listen) dropped, by kind: unrouted (the topic names no discovered engine) or malformed.",
		[]string{"kind"}, nil)
	descPush = prometheus.NewDesc("kvroute_metrics_pushes_total",
		"State pushes by gateway and result (ok, connect, timeout, unauthorized, status, token).",
		[]string{"gateway", "result"}, nil)
	descPushFailing = prometheus.NewDesc("kvroute_metrics_push_consecutive_failures",
		"Failed pushes to the gateway since its last success.", []string{"gateway"}, nil)
	descPushLatency = prometheus.NewDesc("kvroute_metrics_push_last_latency_seconds",
		"Latency of the last successful push to the gateway.", []string{"gateway"}, nil)
	descPushCaughtUp = prometheus.NewDesc("kvroute_metrics_push_caught_up_total",
		"Pushes to the gateway that carried the routes and removals of pushes it had skipped (busy with an earlier push, or failing).", []string{"gateway"}, nil)
)

// pullCollector reads the KV trackers' and pusher's own counters.
type pullCollector struct{ s *Service }

func (c *pullCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descKV, descBridge, descCached, descKVUp, descListen, descPush, descPushFailing, descPushLatency, descPushCaughtUp} {
		ch <- d
	}
}

func (c *pullCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	s.mu.Lock()
	type kvHost struct {
		addr      string
		st        [11]float64
		cached    int
		connected bool
		bridge    [6]float64
	}
	var kv []kvHost
	for addr, h := range s.hosts {
		// One series per rank: rank 0 under the endpoint's address, the
		// others under host:port|rank (their location at the gateways).
		for r, re := range h.events {
			if re == nil {
				continue
			}
			st := re.tracker.Stats()
			sub, loc, unknownRanks := re.sub, addr, 0.0
			if r == 0 {
				sub, unknownRanks = h.sub, float64(h.sub.UnknownRanks())
			} else {
				loc = snapshot.Location(addr, r, r+1)
			}
			if sub == nil {
				sub = h.sub // listen mode: every rank on the one socket
			}
			connected := sub.Connected()
			b := re.bridge.stats()
			kv = append(kv, kvHost{addr: loc, cached: re.tracker.CachedBlocks(), connected: connected,
				st: [11]float64{float64(st.Batches), float64(st.Events), float64(st.Clears), float64(st.Gaps),
					float64(st.MissedBatches), float64(st.Replayed), float64(st.Restarts), float64(st.DecodeErrors),
					float64(st.Unknown), float64(st.Overflow), unknownRanks},
				bridge: [6]float64{float64(b.Routes), float64(b.Expired), float64(b.Matched), float64(b.Unmatched), float64(b.Removed), float64(b.Unmapped)}})
		}
	}
	l := s.listener
	s.mu.Unlock()
	if l != nil {
		ch <- prometheus.MustNewConstMetric(descListen, prometheus.CounterValue, float64(l.Unrouted()), "unrouted")
		ch <- prometheus.MustNewConstMetric(descListen, prometheus.CounterValue, float64(l.Malformed()), "malformed")
	}
	kinds := [11]string{"batches", "events", "clears", "gaps", "missed_batches", "replayed_batches", "restarts", "decode_errors", "unknown_events", "overflow", "unknown_rank"}
	for _, h := range kv {
		for i, k := range kinds {
			ch <- prometheus.MustNewConstMetric(descKV, prometheus.CounterValue, h.st[i], h.addr, k)
		}
		for i, k := range [6]string{"routes", "expired", "matched", "unmatched", "removed", "unmapped"} {
			ch <- prometheus.MustNewConstMetric(descBridge, prometheus.CounterValue, h.bridge[i], h.addr, k)
		}
		ch <- prometheus.MustNewConstMetric(descCached, prometheus.GaugeValue, float64(h.cached), h.addr)
		up := 0.0
		if h.connected {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(descKVUp, prometheus.GaugeValue, up, h.addr)
	}
	for _, g := range s.pusher.Stats() {
		ch <- prometheus.MustNewConstMetric(descPush, prometheus.CounterValue, float64(g.OK), g.URL, "ok")
		for reason, n := range g.FailedBy {
			ch <- prometheus.MustNewConstMetric(descPush, prometheus.CounterValue, float64(n), g.URL, reason)
		}
		ch <- prometheus.MustNewConstMetric(descPushFailing, prometheus.GaugeValue, float64(g.Consecutive), g.URL)
		ch <- prometheus.MustNewConstMetric(descPushLatency, prometheus.GaugeValue, g.LastLatency.Seconds(), g.URL)
		ch <- prometheus.MustNewConstMetric(descPushCaughtUp, prometheus.CounterValue, float64(g.CaughtUp), g.URL)
	}
}
