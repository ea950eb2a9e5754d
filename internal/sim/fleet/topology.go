package fleet

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/workload"
)

// Topology is the production shape a run simulates: Gateways replicas
// behind a load balancer, each an Envoy with Workers worker threads, each
// worker its own Wasm VM with its own router. The workers of one gateway
// share one shared-data store (the index, the load counters, the session
// pins: compare-and-set, as Envoy's); gateways share nothing but what the
// metrics service carries: the scraped engine state it pushes, and the
// gateways' reports of their recent routing, which it merges and pushes
// back to every gateway (docs/topology.md).
type Topology struct {
	Gateways, Workers int
	// RoundRobin spreads new connections over gateways, and each
	// gateway's over its workers, in turn; otherwise at random, as a
	// cloud load balancer and the kernel's SO_REUSEPORT hashing do.
	RoundRobin bool
	// Seed seeds the random spread.
	Seed uint64
	// PushDelay is how long after the service's scrape its push reaches
	// the gateways (default 0: the scrape's own age is the push interval).
	PushDelay time.Duration
	// ReportInterval is how often each gateway reports its routing
	// (default 50 ms); ReportDelay is the time from a report to the
	// other gateways applying the service's merged push of it (default
	// 20 ms: the report's POST, the merge, the push's POST, in-cluster). Reports off
	// (NoReports) leaves each gateway to its own traffic: the ablation.
	ReportInterval, ReportDelay time.Duration
	NoReports                   bool
	// perWorker keeps session pins and prefix memory in each worker's
	// VM, as they were before they moved to shared data: tests show what
	// that costs.
	perWorker bool
	// noRemoteLoad drops the reports' load counts (routes still flow):
	// tests show what they are worth.
	noRemoteLoad bool
}

// DefaultTopology is one gateway with one worker: the shape every figure
// before topologies measured.
var DefaultTopology = Topology{Gateways: 1, Workers: 1}

// SingleRouterPeers are the peer emulations whose published multi-replica
// mechanism gives every replica the same picture, so the simulator runs
// them as one logical router whatever the topology: GIE's endpoint picker
// runs one active instance that every gateway calls; Dynamo's KV router
// replicas each consume every engine's KV events and share in-flight load
// (--router-replica-sync); SGLang's gateway syncs its prefix trees over a
// mesh. Modelled as instant, which is generous to the peer.
var SingleRouterPeers = map[string]bool{"gie_default": true, "dynamo_kv": true, "sglang_cache_aware": true}

func (t *Topology) withDefaults() error {
	if t.Gateways < 1 || t.Workers < 1 {
		return fmt.Errorf("topology %d gateways x %d workers: both must be at least 1", t.Gateways, t.Workers)
	}
	if t.ReportInterval <= 0 {
		t.ReportInterval = 50 * time.Millisecond
	}
	if t.ReportDelay <= 0 {
		t.ReportDelay = 20 * time.Millisecond
	}
	return nil
}

// gateway is one simulated Envoy: its shared data and its workers.
type gateway struct {
	store   *index.MemStore
	workers []*RealRouter
	next    int // round robin over workers
	// routes are the routing decisions not yet reported, as the report
	// carries them: host and block-hash chain, with when and by which
	// worker they were decided.
	routes []route
}

type route struct {
	replica int
	chain   []uint64
	at      time.Duration
	worker  int
}

// flushedBy is the last time worker wi of w flushed its routes into the
// gateway's report ring at or before now: every ReportInterval/4 (the
// filter's tick), the workers' ticks spread over that period.
func (t *Topology) flushedBy(wi, w int, now time.Duration) time.Duration {
	p := max(t.ReportInterval/4, 5*time.Millisecond)
	phase := p * time.Duration(wi) / time.Duration(w)
	if now < phase {
		return -1
	}
	return phase + (now-phase)/p*p
}

// routingReport is what one gateway sent at one report tick.
type routingReport struct {
	from   int
	routes []route
	loads  []index.Load // by replica: this gateway's own outstanding work
}

// TopologyRouter routes through G x W simulated workers. It implements
// Router, its observers and Scheduler.
type TopologyRouter struct {
	top    Topology
	gws    []*gateway
	single bool // a SingleRouterPeers emulation: one router for all
	rng    *rand.Rand
	nextGW int
	owner  map[int]*RealRouter
	at     func(t time.Duration, fn func(now time.Duration))
	// Reports counts reports applied by a gateway other than their sender.
	Reports int
}

// NewTopology returns strategy name at topology top over n replicas.
func NewTopology(name string, n int, opt StrategyOptions, top Topology) (*TopologyRouter, error) {
	if err := top.withDefaults(); err != nil {
		return nil, err
	}
	t := &TopologyRouter{top: top, single: SingleRouterPeers[name], owner: map[int]*RealRouter{},
		rng: rand.New(rand.NewPCG(top.Seed, 0x70901))}
	g, w := top.Gateways, top.Workers
	if t.single {
		g, w = 1, 1
	}
	for gi := range g {
		gw := &gateway{store: &index.MemStore{}}
		for wi := range w {
			o := opt
			o.Seed = opt.Seed + uint64(gi*1000+wi) // each VM its own randomness
			var shared index.Store = gw.store
			if top.perWorker {
				shared = nil
			}
			r, err := newRealRouter(name, n, o, gw.store, shared)
			if err != nil {
				return nil, err
			}
			if !top.NoReports && g > 1 {
				r.onRoute = func(k int, chain []uint64) {
					gw.routes = append(gw.routes, route{replica: k, chain: slices.Clone(chain),
						at: time.Duration(r.nowMs) * time.Millisecond, worker: wi})
				}
			}
			gw.workers = append(gw.workers, r)
		}
		t.gws = append(t.gws, gw)
	}
	return t, nil
}

// Start implements Scheduler: the gateways report on their tick.
func (t *TopologyRouter) Start(at func(time.Duration, func(time.Duration))) {
	t.at = at
	if len(t.gws) > 1 && !t.top.NoReports {
		var tick func(now time.Duration)
		tick = func(now time.Duration) {
			t.report(now)
			at(now+t.top.ReportInterval, tick)
		}
		at(t.top.ReportInterval, tick)
	}
}

// pick is the load balancer and the kernel: the worker a request lands
// on. Every request opens its own connection (the worst case for anything
// kept per worker: a conversation's turns land anywhere), spread at random
// or in turn.
func (t *TopologyRouter) pick() *RealRouter {
	if len(t.gws) == 1 && len(t.gws[0].workers) == 1 {
		return t.gws[0].workers[0]
	}
	var gi, wi int
	if t.top.RoundRobin {
		gi = t.nextGW % len(t.gws)
		t.nextGW++
		gw := t.gws[gi]
		wi = gw.next % len(gw.workers)
		gw.next++
	} else {
		gi = t.rng.IntN(len(t.gws))
		wi = t.rng.IntN(len(t.gws[gi].workers))
	}
	return t.gws[gi].workers[wi]
}

// Route implements Router.
func (t *TopologyRouter) Route(wr *workload.Request, prompt string, now time.Duration) int {
	r := t.pick()
	t.owner[wr.ID] = r
	return r.Route(wr, prompt, now)
}

// FirstToken implements FirstTokenObserver: the worker that routed the
// request sees its response.
func (t *TopologyRouter) FirstToken(wr *workload.Request, replica int, now time.Duration) {
	if r := t.owner[wr.ID]; r != nil {
		r.FirstToken(wr, replica, now)
	}
}

// Done implements DoneObserver.
func (t *TopologyRouter) Done(wr *workload.Request, replica int, cached int, now time.Duration) {
	if r := t.owner[wr.ID]; r != nil {
		r.Done(wr, replica, cached, now)
		delete(t.owner, wr.ID)
	}
}

// ObserveState implements StateObserver: the metrics service's scrape,
// pushed to every gateway (after PushDelay), where one worker stores it in
// shared data and every worker reads it.
func (t *TopologyRouter) ObserveState(st []sim.Stats, now time.Duration) {
	if t.top.PushDelay <= 0 || t.at == nil {
		t.apply(st, now)
		return
	}
	cp := slices.Clone(st)
	t.at(now+t.top.PushDelay, func(at time.Duration) { t.apply(cp, at) })
}

func (t *TopologyRouter) apply(st []sim.Stats, now time.Duration) {
	for _, gw := range t.gws {
		for _, r := range gw.workers {
			r.ObserveState(st, now)
		}
	}
}

// report sends every gateway's routing since its last report and its own
// load counters to the metrics service; the service's merged push reaches
// the other gateways ReportDelay later. A route is in the report once its
// worker flushed it into the gateway's ring (Topology.flushedBy): the
// filter's workers flush on their tick, and one of them reports.
func (t *TopologyRouter) report(now time.Duration) {
	reps := make([]routingReport, len(t.gws))
	for gi, gw := range t.gws {
		r0 := gw.workers[0]
		r0.nowMs = now.Milliseconds()
		loads := r0.ix.Loads(nil)
		own := make([]index.Load, len(r0.hosts))
		for i, h := range r0.hosts {
			if h.Slot >= 0 && h.Slot < len(loads) {
				own[i] = loads[h.Slot]
			}
		}
		var sent, kept []route
		for _, ro := range gw.routes {
			if ro.at <= t.top.flushedBy(ro.worker, len(gw.workers), now) {
				sent = append(sent, ro)
			} else {
				kept = append(kept, ro)
			}
		}
		reps[gi] = routingReport{from: gi, routes: sent, loads: own}
		gw.routes = kept
	}
	t.at(now+t.top.ReportDelay, func(at time.Duration) { t.merge(reps, at) })
}

// merge applies the service's merged push of one round of reports: every
// gateway marks the other gateways' routes in its index and prefix memory
// (a route is a prefix that host now computed) and takes their load counts
// as remote load. A gateway skips its own report; applying a report twice
// (two service replicas both pushing it) marks the same blocks again and
// sets the same counts, which changes nothing.
func (t *TopologyRouter) merge(reps []routingReport, now time.Duration) {
	g := int64(len(reps))
	for gi, gw := range t.gws {
		r0 := gw.workers[0]
		r0.nowMs = now.Milliseconds()
		var total [3][]int64
		for f := range total {
			total[f] = make([]int64, len(r0.hosts))
		}
		for _, rp := range reps {
			for i, l := range rp.loads {
				if rp.from == gi {
					// Own counts at the report, scaled as the router
					// scales the own counts it reads (Host.LoadMirror).
					total[0][i] -= (g - 1) * int64(l.InFlight)
					total[1][i] -= (g - 1) * int64(l.PrefillTokens)
					total[2][i] -= (g - 1) * int64(l.DecodeTokens)
					continue
				}
				total[0][i] += int64(l.InFlight)
				total[1][i] += int64(l.PrefillTokens)
				total[2][i] += int64(l.DecodeTokens)
			}
			if rp.from == gi {
				continue
			}
			t.Reports++
			for _, ro := range rp.routes {
				h := &r0.hosts[ro.replica]
				if h.Slot < 0 {
					continue
				}
				_ = r0.r.Learn(index.HostRef{Slot: h.Slot, Gen: h.Gen}, h.Address, ro.chain, 0)
			}
		}
		if t.top.noRemoteLoad {
			continue
		}
		for _, r := range gw.workers {
			for i := range r.hosts {
				h := &r.hosts[i]
				h.RemoteInFlight = int(total[0][i])
				h.RemotePrefillTokens = total[1][i]
				h.RemoteDecodeTokens = total[2][i]
				h.LoadMirror = int(g)
			}
		}
	}
}

// Stats sums the workers' router counters.
func (t *TopologyRouter) Stats() (decisions, failedOpen int) {
	for _, gw := range t.gws {
		for _, r := range gw.workers {
			decisions += int(r.Stats().Decisions)
			failedOpen += r.FailedOpen
		}
	}
	return decisions, failedOpen
}
