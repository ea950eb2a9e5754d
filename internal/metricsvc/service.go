// Package metricsvc is `kvroute metrics`, the cluster-metrics service: it
// discovers engines, scrapes their /metrics, follows their KV events and
// pushes the resulting fleet snapshot to every gateway.
//
// The router filter only sees the load that passes through its own Envoy.
// The engines know their real queues, KV use and cache capacity; this
// service gathers that truth in one place and pushes the same picture to
// every gateway replica, which also keeps several replicas consistent.
//
// The parts, one package each:
//   - discovery: which engines exist (static file, DNS, Kubernetes);
//   - scrape: one loop per engine reading its /metrics at a short interval;
//   - kvevents: one ZMQ subscriber per engine tracking its cached blocks;
//   - push: one delivery goroutine per gateway, latest snapshot wins.
//
// Service ties them together. Every scrape result and KV event batch wakes
// the assembler, which builds a snapshot.State; it is published when its
// content changed, and at least once per push interval so gateways can
// tell a live service from a dead one by the snapshot's timestamp. An
// engine is healthy while its last scrape succeeded and is at most an
// interval plus a scrape timeout old (two intervals by default), so a
// silent engine drops out within two intervals and returns with its next
// good answer.
package metricsvc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/metricsvc/discovery"
	"github.com/kvroute/kvroute/internal/metricsvc/kvevents"
	"github.com/kvroute/kvroute/internal/metricsvc/push"
	"github.com/kvroute/kvroute/internal/metricsvc/scrape"
	"github.com/kvroute/kvroute/snapshot"
)

// Config configures a Service. Zero durations take the documented defaults.
type Config struct {
	// Source discovers the engines. Required.
	Source discovery.Source
	// ScrapeInterval is how often each engine is scraped (default 100 ms);
	// ScrapeTimeout bounds one scrape (default: 80% of the interval).
	ScrapeInterval, ScrapeTimeout time.Duration
	// MetricsPath is the engines' metrics path (default /metrics).
	MetricsPath string
	// Gateways are the state URLs pushed to, e.g.
	// http://gw-0.gw:8080/.kvroute/v1/state. Empty: scrape only.
	Gateways []string
	// Token is the bearer token for pushes. Required with Gateways.
	Token push.TokenSource
	// PushInterval is the longest time between two pushes (default 1 s);
	// a change is pushed at once. PushTimeout bounds one push (default 2 s).
	PushInterval, PushTimeout time.Duration
	// KVEventsTopic filters KV event messages by topic prefix (default all).
	KVEventsTopic string
	// KVEventsListen, when set (e.g. tcp://*:5557), binds a socket that
	// engines publishing the llm-d way connect out to, each under the topic
	// kv@<pod-ip>@<model>: their batches go to the discovered engine with
	// that IP (and that model, when several share the IP). Engines with a
	// kvEvents endpoint of their own are still dialled (vLLM's way).
	KVEventsListen string
	// BridgeLag is how long an engine's KV event batches wait before the
	// cache-state bridge reads them (default DefaultBridgeLag): the routes
	// that explain them arrive with the gateways' next reports, so it must
	// exceed the gateways' report interval plus a POST (bridge.go).
	BridgeLag time.Duration
	// Name identifies this instance in snapshots (snapshot.State.Source).
	Name string
	Log  *slog.Logger
	// ScrapeClient and PushClient override the HTTP clients (tests).
	ScrapeClient, PushClient *http.Client

	// bridgeClock is the cache-state bridge's clock (time.Now when nil): a
	// batch's arrival, a route's arrival and the drain that compares them
	// with BridgeLag all read it, so that a test can hold batches queued
	// until their route is in, however slow its machine.
	bridgeClock func() time.Time
}

// Service is one running cluster-metrics service.
type Service struct {
	cfg     Config
	log     *slog.Logger
	scrapeC *http.Client
	pusher  *push.Pusher
	tel     *telemetry

	wake chan struct{}

	mu        sync.Mutex
	ctx       context.Context // the Run context, parent of per-host loops
	hosts     map[string]*host
	started   time.Time
	lastTick  time.Time
	published []snapshot.Host // hosts of the last published snapshot
	lastPub   time.Time
	current   snapshot.State
	discOK    bool
	listener  *kvevents.Listener
	reports   reportBook // gateways' routing reports for the next push (reports.go)
	pulls     *pullLog   // what was pushed, for pulling gateways (pull.go)
}

// host is the service's state for one engine.
type host struct {
	ep     discovery.Endpoint
	ctx    context.Context // the host's loops' (rank subscribers start later)
	cancel context.CancelFunc
	// sub follows the engine's KV events: rank 0's publisher in connect
	// mode, every rank's in listen mode (nil when KV events are off).
	sub *kvevents.Subscriber
	// events are the KV events of each data-parallel rank, indexed by rank
	// (one entry for an engine without ranks); s.mu guards the slice.
	events []*rankEvents
	// followedRanks is the rank count followRanks last acted on: a change
	// of the engine's ranks, not every scrape, (re)starts subscribers.
	followedRanks int

	attempted  bool
	failing    bool
	lastReason string // of the last scrape ("" when it succeeded)
	lastOK     time.Time
	lastErr    string
	sample     scrape.Sample
}

// New validates cfg and builds a Service; Run starts it.
func New(cfg Config) (*Service, error) {
	if cfg.Source == nil {
		return nil, errors.New("metrics service: no discovery source configured (use an endpoints file, a DNS name or a Kubernetes service)")
	}
	if cfg.ScrapeInterval <= 0 {
		cfg.ScrapeInterval = 100 * time.Millisecond
	}
	if cfg.ScrapeTimeout <= 0 {
		// 80% of the interval: a hung engine's scrape fails at most 1.8
		// intervals after it went silent, inside the two-interval promise
		// with room for the push itself.
		cfg.ScrapeTimeout = cfg.ScrapeInterval * 4 / 5
	}
	if cfg.MetricsPath == "" {
		cfg.MetricsPath = "/metrics"
	}
	if cfg.PushInterval <= 0 {
		cfg.PushInterval = time.Second
	}
	if cfg.PushTimeout <= 0 {
		cfg.PushTimeout = 2 * time.Second
	}
	if cfg.BridgeLag <= 0 {
		cfg.BridgeLag = DefaultBridgeLag
	}
	if cfg.bridgeClock == nil {
		cfg.bridgeClock = time.Now
	}
	for _, g := range cfg.Gateways {
		if err := CheckGatewayURL(g); err != nil {
			return nil, fmt.Errorf("metrics service: %w", err)
		}
	}
	if len(cfg.Gateways) > 0 && cfg.Token == nil {
		return nil, errors.New("metrics service: gateways are configured but no state token (give a token file or a token environment variable)")
	}
	if cfg.Token != nil {
		if _, err := cfg.Token.Token(); err != nil {
			return nil, fmt.Errorf("metrics service: %w", err)
		}
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	s := &Service{
		cfg:   cfg,
		log:   log,
		wake:  make(chan struct{}, 1),
		hosts: map[string]*host{},
		pulls: newPullLog(),
	}
	s.scrapeC = cfg.ScrapeClient
	if s.scrapeC == nil {
		s.scrapeC = &http.Client{Transport: &http.Transport{
			// Engines are in-cluster: no proxy. Keep a connection per
			// engine warm, since it is used ten times a second.
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: cfg.ScrapeTimeout, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     90 * time.Second,
		}}
	}
	pc := cfg.PushClient
	if pc == nil {
		pc = &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 2, IdleConnTimeout: 90 * time.Second}}
	}
	s.pusher = push.New(cfg.Gateways, cfg.Token, pc, log)
	s.pusher.Timeout = cfg.PushTimeout
	s.tel = newTelemetry(s)
	return s, nil
}

// Run runs the service until ctx is done. It returns an error only when
// discovery cannot start (a configuration problem).
func (s *Service) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.mu.Lock()
	s.ctx = ctx
	s.started = time.Now()
	s.mu.Unlock()

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.pusher.Run(ctx) }()
	go func() { defer wg.Done(); s.assembleLoop(ctx) }()
	if s.cfg.KVEventsListen != "" {
		l := &kvevents.Listener{Endpoint: s.cfg.KVEventsListen, Topic: s.cfg.KVEventsTopic, Route: s.routeTopic, Log: s.log}
		s.mu.Lock()
		s.listener = l
		s.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.Run(ctx); err != nil {
				s.log.Error("KV event listener stopped; engines publishing to it are not followed", "err", err)
			}
		}()
	}

	s.log.Info("metrics service starting", "discovery", s.cfg.Source.Name(),
		"scrape_interval", s.cfg.ScrapeInterval, "gateways", len(s.cfg.Gateways))
	err := s.cfg.Source.Run(ctx, s.setEndpoints)
	if err != nil {
		err = fmt.Errorf("discovery (%s): %w", s.cfg.Source.Name(), err)
	}
	cancel()
	wg.Wait()
	s.mu.Lock()
	for addr, h := range s.hosts {
		h.cancel()
		delete(s.hosts, addr)
	}
	s.mu.Unlock()
	return err
}

// setEndpoints applies a discovery update: new engines get a scrape loop
// (and a KV event subscriber), gone ones are stopped, changed ones are
// restarted with their new settings.
func (s *Service) setEndpoints(eps []discovery.Endpoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.discOK = true
	s.tel.discoveryUpdates.Inc()
	want := make(map[string]discovery.Endpoint, len(eps))
	for _, e := range eps {
		want[e.Address] = e
	}
	for addr, h := range s.hosts {
		e, ok := want[addr]
		if ok && e.KVEvents == h.ep.KVEvents && e.KVEventsReplay == h.ep.KVEventsReplay {
			h.ep = e // role, model or adapters changed: no restart needed
			continue
		}
		h.cancel()
		delete(s.hosts, addr)
		s.tel.forget(addr)
		if !ok {
			s.log.Info("engine removed", "host", addr)
		}
	}
	for addr, e := range want {
		if _, ok := s.hosts[addr]; ok {
			continue
		}
		s.startHost(e)
		s.log.Info("engine added", "host", addr, "role", e.Role, "model", e.Model, "kv_events", e.KVEvents)
	}
	s.notify()
}

// startHost starts an engine's loops; s.mu is held.
func (s *Service) startHost(e discovery.Endpoint) {
	hctx, cancel := context.WithCancel(s.ctx)
	h := &host{ep: e, ctx: hctx, cancel: cancel}
	s.hosts[e.Address] = h
	loop := &scrape.Loop{
		Client:   s.scrapeC,
		Address:  e.Address,
		URL:      "http://" + e.Address + s.cfg.MetricsPath,
		Interval: s.cfg.ScrapeInterval,
		Timeout:  s.cfg.ScrapeTimeout,
		Report:   func(r scrape.Result) { s.onScrape(h, r) },
	}
	go loop.Run(hctx)
	if e.KVEvents != "" || s.cfg.KVEventsListen != "" {
		r0 := newRankEvents(s.cfg.bridgeClock)
		h.events = []*rankEvents{r0}
		h.sub = &kvevents.Subscriber{
			Endpoint:       e.KVEvents,
			ReplayEndpoint: e.KVEventsReplay,
			Topic:          s.cfg.KVEventsTopic,
			Tracker:        r0.tracker,
			Log:            s.log.With("host", e.Address),
			OnChange:       s.notify,
		}
		r0.sub = h.sub
		if e.KVEvents != "" {
			h.sub.OnBatch = r0.batch
			go h.sub.Run(hctx)
		} else {
			// Listen mode: every rank's publisher connects to the one
			// socket; each batch names its rank.
			h.sub.Ranks = func(rank int) *kvevents.Tracker { return s.rankTracker(h, rank) }
			h.sub.OnBatch = func(b kvevents.Batch, res kvevents.SeqResult) {
				if r := s.rankEvents(h, max(b.DataParallelRank, 0)); r != nil {
					r.batch(b, res)
				}
			}
		}
	}
}

// rankEvents is one data-parallel rank's KV events. vLLM and SGLang run one
// publisher per rank (its own sequence numbers, on the endpoint's port plus
// the rank), and each rank is a cache location of its own at the gateways
// (host:port|rank): its own cached-block count, clears and cache-state
// bridge.
type rankEvents struct {
	tracker *kvevents.Tracker
	bridge  *hostBridge          // precise cache state (bridge.go)
	sub     *kvevents.Subscriber // connect mode: the rank's own subscriber
	cancel  context.CancelFunc   // connect mode, ranks above 0
	now     func() time.Time     // the bridge's clock (Config.bridgeClock)
}

func newRankEvents(now func() time.Time) *rankEvents {
	return &rankEvents{tracker: &kvevents.Tracker{}, bridge: newHostBridge(), now: now}
}

func (r *rankEvents) batch(b kvevents.Batch, _ kvevents.SeqResult) { r.bridge.batch(b, r.now()) }

// lost counts the rank's events lost for good: sequence gaps left after
// replay and batches that could not be decoded.
func (r *rankEvents) lost() uint64 {
	st := r.tracker.Stats()
	return st.Gaps + st.DecodeErrors
}

// preciseCacheState reports whether the gateways may trust the rank's
// removals instead of their capacity model (hostBridge.trusted).
func (r *rankEvents) preciseCacheState() bool {
	return r.sub != nil && r.bridge.trusted(r.sub.Connected())
}

// rankTracker is the tracker of rank of h for a listen-mode batch, made on
// its first batch: nil (the batch is dropped and counted) for a rank the
// engine's last good scrape does not show; before the first one, any rank
// below the gateways' bound.
func (s *Service) rankTracker(h *host, rank int) *kvevents.Tracker {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := scrape.MaxRanks
	if !h.lastOK.IsZero() {
		n = max(len(h.sample.Ranks), 1)
	}
	if rank >= n {
		return nil
	}
	for len(h.events) <= rank {
		h.events = append(h.events, nil)
	}
	if h.events[rank] == nil {
		h.events[rank] = newRankEvents(s.cfg.bridgeClock)
		h.events[rank].sub = h.sub // listen mode: one socket for every rank
	}
	return h.events[rank].tracker
}

// rankEvents returns rank of h, nil when it has none.
func (s *Service) rankEvents(h *host, rank int) *rankEvents {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rank < len(h.events) {
		return h.events[rank]
	}
	return nil
}

// followRanks gives each data-parallel rank of a connect-mode engine its
// own subscriber, on the engine's KV events endpoint (and replay endpoint)
// offset by the rank, once its metrics show n ranks; ranks the engine no
// longer shows are stopped. s.mu is held.
func (s *Service) followRanks(h *host, n int) {
	if h.ep.KVEvents == "" || h.events == nil {
		return
	}
	for r := len(h.events) - 1; r >= max(n, 1); r-- {
		if c := h.events[r]; c != nil && c.cancel != nil {
			c.cancel()
		}
		h.events = h.events[:r]
	}
	for r := len(h.events); r < n; r++ {
		ep, err := kvevents.RankEndpoint(h.ep.KVEvents, r)
		replay, rerr := kvevents.RankEndpoint(h.ep.KVEventsReplay, r)
		if err != nil || rerr != nil {
			s.log.Warn("cannot follow a data-parallel rank's KV events", "host", h.ep.Address, "rank", r, "err", errors.Join(err, rerr))
			return
		}
		re := newRankEvents(s.cfg.bridgeClock)
		ctx, cancel := context.WithCancel(h.ctx)
		re.cancel = cancel
		re.sub = &kvevents.Subscriber{
			Endpoint:       ep,
			ReplayEndpoint: replay,
			Topic:          s.cfg.KVEventsTopic,
			Tracker:        re.tracker,
			Log:            s.log.With("host", h.ep.Address, "rank", r),
			OnChange:       s.notify,
			OnBatch:        re.batch,
		}
		h.events = append(h.events, re)
		go re.sub.Run(ctx)
	}
}

// routeTopic names the engine an llm-d topic (kv@<pod-ip>@<model>) comes
// from: the discovered engine at that IP, and of that model when several
// engines share the IP. nil for any other topic, or when the IP's several
// engines serve other models.
func (s *Service) routeTopic(topic string) *kvevents.Subscriber {
	ip, model, ok := kvevents.ParseTopic(topic)
	if !ok {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var found *kvevents.Subscriber
	atIP := 0
	for addr, h := range s.hosts {
		hip, _, err := net.SplitHostPort(addr)
		if err != nil || hip != ip || h.sub == nil {
			continue
		}
		m := h.ep.Model
		if m == "" {
			m = h.sample.Model
		}
		if m == model {
			return h.sub
		}
		atIP++
		found = h.sub
	}
	if atIP != 1 {
		return nil // several engines at this IP, none of this model
	}
	return found
}

func (s *Service) onScrape(h *host, r scrape.Result) {
	s.mu.Lock()
	if s.hosts[h.ep.Address] != h {
		s.mu.Unlock()
		return // removed meanwhile (its series are gone; do not recreate them)
	}
	s.tel.observeScrape(r)
	wasFailing, first, lastReason := h.failing, !h.attempted, h.lastReason
	h.attempted = true
	h.lastReason = r.Reason
	if r.Err == nil {
		h.failing = false
		h.lastOK = r.At
		h.lastErr = ""
		h.sample = r.Sample
		if n := len(r.Sample.Ranks); n != h.followedRanks {
			s.followRanks(h, n)
			h.followedRanks = n
		}
	} else {
		h.failing = true
		h.lastErr = r.Err.Error()
	}
	s.mu.Unlock()
	// Logged on transitions only (and when the reason changes): a broken
	// engine scraped ten times a second must not write ten lines a second;
	// the counters carry every failure.
	switch {
	case r.Err != nil && !wasFailing:
		s.log.Warn("engine scrape failed; marked unhealthy", "host", r.Address, "reason", r.Reason, "err", r.Err)
	case r.Err != nil && r.Reason != lastReason:
		s.log.Warn("engine scrape still failing, for another reason", "host", r.Address, "reason", r.Reason, "err", r.Err)
	case r.Err == nil && (wasFailing || first):
		s.log.Info("engine answers; healthy", "host", r.Address, "engine", r.Sample.Engine, "model", r.Sample.Model)
	}
	s.notify()
}

func (s *Service) notify() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// assembleLoop builds and publishes snapshots on every wake-up and on a
// half-interval tick (so an engine that stops answering ages out on time
// even when nothing else happens).
//
// Wake-ups closer than a tenth of the scrape interval are merged: a fleet of
// N engines reports N results per interval, and assembling (and encoding)
// the whole snapshot for each would cost O(N²) per interval.
func (s *Service) assembleLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.ScrapeInterval / 2)
	defer t.Stop()
	minGap := s.cfg.ScrapeInterval / 10
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-t.C:
		}
		if wait := minGap - time.Since(last); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		last = time.Now()
		s.assembleAndPublish(last)
	}
}

// healthy is the health rule; s.mu is held. A failed scrape marks the
// engine unhealthy at once: a killed engine refuses the next scrape (at
// most one interval later) and a hung one times out (at most one interval
// plus the timeout, 1.8 intervals by default). The age check is the
// backstop for a scrape loop that is itself stuck: no good answer for two
// intervals (or an interval plus a longer configured timeout) is unhealthy
// too.
func (s *Service) healthy(h *host, now time.Time) bool {
	maxAge := max(2*s.cfg.ScrapeInterval, s.cfg.ScrapeInterval+s.cfg.ScrapeTimeout)
	return h.attempted && !h.failing && !h.lastOK.IsZero() && now.Sub(h.lastOK) <= maxAge
}

func (s *Service) assembleAndPublish(now time.Time) {
	s.mu.Lock()
	s.lastTick = now
	st := snapshot.State{Version: snapshot.Version, TimestampMs: now.UnixMilli(), Source: s.cfg.Name, Hosts: []snapshot.Host{}}
	warm := true
	for _, h := range s.hosts {
		if !h.attempted {
			warm = false
		}
		st.Hosts = appendRanks(st.Hosts, s.hostSnapshot(h, now), h.sample.Ranks, h.events)
	}
	started, lastPub, prev, discovered := s.started, s.lastPub, s.published, s.discOK
	s.mu.Unlock()
	// Nothing is pushed before discovery has produced its first set: an
	// empty snapshot would take every candidate away from the gateways
	// while, say, the Kubernetes informers are still syncing.
	if !discovered {
		return
	}
	sort.Slice(st.Hosts, func(i, j int) bool {
		a, b := &st.Hosts[i], &st.Hosts[j]
		return a.Address < b.Address || a.Address == b.Address && a.Rank < b.Rank
	})

	// Until every engine has been tried once (or a second has passed),
	// hold back: a first push of never-scraped hosts would mark the whole
	// fleet unhealthy at every gateway.
	if !warm && now.Sub(started) < time.Second {
		return
	}
	s.drainBridges(s.cfg.bridgeClock())
	reports, fresh := s.reports.take(now)
	st.Gateways = reports
	st.Removals = s.reports.takeRemovals()
	changed := prev == nil || !sameContent(st.Hosts, prev) || fresh
	if !changed && now.Sub(lastPub) < s.cfg.PushInterval {
		return
	}
	body, err := json.Marshal(st)
	if err != nil { // cannot happen with these types; never push garbage
		s.log.Error("encoding snapshot", "err", err)
		return
	}
	seq := s.pulls.add(&st, now) // first: a pull in between finds the routes logged
	s.mu.Lock()
	s.published, s.lastPub, s.current = st.Hosts, now, st
	s.mu.Unlock()
	s.tel.published(st, changed)
	// A gateway that skips this push (busy with an earlier one, or
	// failing) gets, with the next one it takes, the routes and removals
	// of those it skipped, from the pull log.
	s.pusher.Publish(seq, body, func(n uint64) []byte {
		b, err := json.Marshal(s.pulls.sinceSeq(st, n))
		if err != nil {
			return body
		}
		return b
	})
}

// sameContent compares what a gateway acts on, leaving out the scrape
// timestamps that move on every scrape, so "changed" means a decision
// could change. Both slices are sorted by address.
func sameContent(a, b []snapshot.Host) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := &a[i], &b[i]
		// Every field but ScrapedAtMs; TestSameContentCoversEveryField
		// fails when snapshot.Host gains one that is not listed here.
		if x.Address != y.Address || x.Role != y.Role || x.Model != y.Model ||
			!slices.Equal(x.Adapters, y.Adapters) || x.Healthy != y.Healthy ||
			x.Waiting != y.Waiting || x.Running != y.Running || x.KVUsage != y.KVUsage ||
			x.BlockSize != y.BlockSize || x.NumGPUBlocks != y.NumGPUBlocks ||
			x.CachedBlocks != y.CachedBlocks || x.ClearedAtMs != y.ClearedAtMs ||
			x.MaxAdapters != y.MaxAdapters || x.AdapterSlotsUsed != y.AdapterSlotsUsed ||
			x.DataParallelSize != y.DataParallelSize || x.Rank != y.Rank || x.PreciseCacheState != y.PreciseCacheState {
			return false
		}
	}
	return true
}

// appendRanks appends h, or, for an engine whose metrics name several
// data-parallel ranks, one entry per rank with that rank's queue, KV usage
// and KV events (each rank is a cache location of its own at the gateways).
func appendRanks(hosts []snapshot.Host, h snapshot.Host, ranks []scrape.Rank, events []*rankEvents) []snapshot.Host {
	if len(ranks) < 2 {
		return append(hosts, withEvents(h, events, 0))
	}
	for i, r := range ranks {
		x := h
		x.DataParallelSize, x.Rank = len(ranks), i
		x.Waiting, x.Running, x.KVUsage = r.Waiting, r.Running, r.KVUsage
		hosts = append(hosts, withEvents(x, events, i))
	}
	return hosts
}

// withEvents sets h's cached blocks and last clear from rank's KV events,
// when they are followed.
func withEvents(h snapshot.Host, events []*rankEvents, rank int) snapshot.Host {
	if rank >= len(events) || events[rank] == nil {
		return h
	}
	t := events[rank].tracker
	h.CachedBlocks = t.CachedBlocks()
	h.PreciseCacheState = events[rank].preciseCacheState()
	if c := t.ClearedAt(); !c.IsZero() {
		h.ClearedAtMs = c.UnixMilli()
	}
	return h
}

// hostSnapshot maps one engine to the wire contract; s.mu is held.
func (s *Service) hostSnapshot(h *host, now time.Time) snapshot.Host {
	out := snapshot.Host{
		Address:      h.ep.Address,
		Role:         h.ep.Role,
		Model:        h.ep.Model,
		Healthy:      s.healthy(h, now),
		Waiting:      h.sample.Waiting,
		Running:      h.sample.Running,
		KVUsage:      h.sample.KVUsage,
		BlockSize:    h.sample.BlockSize,
		NumGPUBlocks: h.sample.NumGPUBlocks,
	}
	if out.Model == "" {
		out.Model = h.sample.Model
	}
	if out.Role == snapshot.RoleBoth {
		out.Role = "" // the contract's default
	}
	out.Adapters = mergeSorted(h.ep.Adapters, h.sample.Adapters)
	if h.sample.MaxAdapters > 0 {
		// Slots are what the engine reports in use, not the merged list:
		// adapters discovery declares need not hold a slot.
		out.MaxAdapters, out.AdapterSlotsUsed = h.sample.MaxAdapters, len(h.sample.Adapters)
	}
	if !h.lastOK.IsZero() {
		out.ScrapedAtMs = h.lastOK.UnixMilli()
	}
	return out
}

func mergeSorted(a, b []string) []string {
	if len(a)+len(b) == 0 {
		return nil
	}
	out := append(slices.Clone(a), b...)
	slices.Sort(out)
	return slices.Compact(out)
}

// CheckGatewayURL reports whether u is a gateway state URL a push can
// reach: http or https, a host, and a path (the gateway answers its state
// path itself; a push to another path would go on to an engine).
func CheckGatewayURL(u string) error {
	const example = "e.g. http://gw-0.gw:9002/.kvroute/v1/state"
	pu, err := url.Parse(u)
	switch {
	case err != nil:
		return fmt.Errorf("gateway %q is not a URL (%v): give the gateway's state URL, %s", u, err, example)
	case pu.Scheme != "http" && pu.Scheme != "https":
		return fmt.Errorf("gateway %q: the scheme must be http or https: give the gateway's state URL, %s", u, example)
	case pu.Host == "" || pu.Hostname() == "":
		return fmt.Errorf("gateway %q has no host: give the gateway's state URL, %s", u, example)
	case pu.Path == "" || pu.Path == "/":
		return fmt.Errorf("gateway %q has no path: give the state path the gateway's plugin serves (state.path), %s", u, example)
	case pu.User != nil:
		return fmt.Errorf("gateway %q carries credentials in the URL: the state token goes in --token-file or its environment variable", u)
	}
	return nil
}

// Snapshot returns the last published snapshot.
func (s *Service) Snapshot() snapshot.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current
}

// Handler serves the service's own endpoints: /metrics (Prometheus),
// /healthz and /state (the last published snapshot, for people).
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", s.tel.handler())
	mux.HandleFunc("GET /healthz", s.serveHealth)
	mux.HandleFunc("GET /livez", s.serveLive)
	mux.HandleFunc("POST "+ReportsPath, s.serveReport)
	mux.HandleFunc("GET /state", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		// Pulling gateways pass the cursor of their previous pull (pull.go).
		json.NewEncoder(w).Encode(s.pulls.since(s.Snapshot(), r.URL.Query().Get("since")))
	})
	return mux
}

type healthReport struct {
	Status   string          `json:"status"`
	Reason   string          `json:"reason,omitempty"`
	Hosts    int             `json:"hosts"`
	Healthy  int             `json:"healthyHosts"`
	Gateways []gatewayHealth `json:"gateways"`
}

type gatewayHealth struct {
	URL                 string `json:"url"`
	Pushed              uint64 `json:"pushed"`
	ConsecutiveFailures int    `json:"consecutiveFailures"`
	Failing             bool   `json:"failing"`
	LastError           string `json:"lastError,omitempty"`
}

// pushFailing reports whether a gateway's pushes are failing: three in a
// row at least, and none delivered for failWindow (or ever).
func pushFailing(g push.GatewayStats, now time.Time, failWindow time.Duration) bool {
	return g.Consecutive >= 3 && (g.LastOK.IsZero() || now.Sub(g.LastOK) > failWindow)
}

// serveHealth answers 200 while discovery has produced a set, the
// assembler is ticking and some gateway takes the pushes: 503 "starting",
// "stalled" or "pushes_failing" (every configured gateway failing, see
// pushFailing: the service delivers nothing, a wrong token or URL, a
// gateway unreachable). Failing engines, or some gateways failing, leave it
// at 200 ("degraded" for the latter): /metrics and this report name them.
// Restarting fixes none of these, so liveness is /livez.
func (s *Service) serveHealth(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	s.mu.Lock()
	rep := healthReport{Status: "ok", Hosts: len(s.hosts), Gateways: []gatewayHealth{}}
	for _, h := range s.hosts {
		if s.healthy(h, now) {
			rep.Healthy++
		}
	}
	stall := max(10*s.cfg.ScrapeInterval, 2*time.Second)
	switch {
	case !s.discOK:
		rep.Status, rep.Reason = "starting", "discovery has not produced an endpoint set yet"
	case now.Sub(s.lastTick) > stall:
		rep.Status, rep.Reason = "stalled", "the snapshot loop has not run for "+now.Sub(s.lastTick).Round(time.Millisecond).String()
	}
	s.mu.Unlock()
	failWindow := max(5*s.cfg.PushInterval, 5*time.Second)
	failing, lastErr := 0, ""
	for _, g := range s.pusher.Stats() {
		f := pushFailing(g, now, failWindow)
		if f {
			failing++
			lastErr = g.URL + ": " + g.LastError
		}
		rep.Gateways = append(rep.Gateways, gatewayHealth{URL: g.URL, Pushed: g.OK, ConsecutiveFailures: g.Consecutive, Failing: f, LastError: g.LastError})
	}
	switch {
	case rep.Status != "ok" || failing == 0:
	case failing == len(rep.Gateways):
		rep.Status, rep.Reason = "pushes_failing", "every gateway's pushes are failing (last: "+lastErr+")"
	default:
		rep.Status, rep.Reason = "degraded", strconv.Itoa(failing)+" of "+strconv.Itoa(len(rep.Gateways))+" gateways' pushes are failing (last: "+lastErr+")"
	}
	w.Header().Set("Content-Type", "application/json")
	if rep.Status != "ok" && rep.Status != "degraded" {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	json.NewEncoder(w).Encode(rep)
}

// serveLive is the liveness probe: 503 only when the snapshot loop has
// stalled, which a restart can fix.
func (s *Service) serveLive(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	last, started := s.lastTick, s.discOK
	s.mu.Unlock()
	stall := max(10*s.cfg.ScrapeInterval, 2*time.Second)
	if started && time.Since(last) > stall {
		http.Error(w, "stalled: the snapshot loop has not run for "+time.Since(last).Round(time.Millisecond).String(), http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, "ok\n")
}
