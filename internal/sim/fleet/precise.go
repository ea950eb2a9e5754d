package fleet

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute/dispatch"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/metricsvc/cachestate"
	"github.com/kvroute/kvroute/internal/metricsvc/kvevents"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/workload"
)

// CacheStates are the ways a router can learn the engines' caches.
var CacheStates = []string{"approximate", "precise"}

// DefaultEventDelay is the time from an engine's KV event batch to the
// gateways' indexes applying the delta it implies: the publisher's queue,
// the metrics service's merge of wake-ups (a tenth of its 100 ms scrape
// interval) and its push, in-cluster.
const DefaultEventDelay = 30 * time.Millisecond

// PreciseRouter is a strategy with precise cache state: the engines' KV
// events, decoded from vLLM's wire format and bridged into kvroute's hash
// space by the metrics service's cachestate.Bridge (one per engine, fed
// with the gateways' routing), move every gateway's index, as the metrics
// service's pushed deltas do in production. The strategy itself, its index
// and the cached_tokens feedback are the approximate router's, unchanged.
type PreciseRouter struct {
	inner Router
	// Delay is DefaultEventDelay unless set before the run.
	Delay time.Duration

	gws     []*RealRouter // one router per gateway: its index is the gateway's shared data
	at      func(time.Duration, func(time.Duration))
	owner   func(wr *workload.Request) *RealRouter
	bridges []*cachestate.Bridge
	due     []dueDelta
	scratch []cachestate.Delta
	// DecodeErrors counts batches the decoder refused (a bug: the
	// simulator's engines publish with the same encoder vLLM's format
	// fixtures hold).
	DecodeErrors int
	// Applied counts deltas applied to the gateways, by kind (once per
	// delta, whatever the number of gateways).
	Applied [3]int
}

type dueDelta struct {
	at      time.Duration
	replica int
	d       cachestate.Delta
}

// NewPrecise wraps a strategy's router (a RealRouter from NewStrategy or a
// TopologyRouter from NewTopology) with precise cache state.
func NewPrecise(r Router) (*PreciseRouter, error) {
	p := &PreciseRouter{inner: r, Delay: DefaultEventDelay}
	switch r := r.(type) {
	case *RealRouter:
		p.gws = []*RealRouter{r}
		p.owner = func(*workload.Request) *RealRouter { return r }
	case *TopologyRouter:
		for _, gw := range r.gws {
			p.gws = append(p.gws, gw.workers[0])
		}
		p.owner = func(wr *workload.Request) *RealRouter { return r.owner[wr.ID] }
	default:
		return nil, fmt.Errorf("precise cache state needs a simulated gateway's router, not %T", r)
	}
	n := len(p.gws[0].hosts)
	p.bridges = make([]*cachestate.Bridge, n)
	for i := range p.bridges {
		p.bridges[i] = &cachestate.Bridge{Hash: p.gws[0].ix.Config().Hash}
	}
	// The engines' evictions now arrive as events: the index's own
	// eviction model (a per-host capacity aging out whole recency buckets)
	// would evict heads the engines keep. As a gateway does for a host the
	// metrics service trusts (filter: candidate.indexCapacity), it stays
	// as a backstop at twice the engine's KV, for blocks no removal will
	// name; a gateway falls back to it for a host whose event stream is
	// down.
	for _, g := range p.gws {
		for i := range g.hosts {
			h := &g.hosts[i]
			if err := g.ix.SetCapacity(index.HostRef{Slot: h.Slot, Gen: h.Gen}, 2*g.capTokens); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

// Route implements Router: deltas already due first (when the run has no
// scheduler), then the decision, which the gateway reports to the metrics
// service's bridge of the chosen engine.
func (p *PreciseRouter) Route(wr *workload.Request, prompt string, now time.Duration) int {
	p.apply(now)
	k := p.inner.Route(wr, prompt, now)
	if r := p.owner(wr); r != nil {
		p.bridges[k].Route(r.hasher.Blocks(), r.hasher.Len(), now.Milliseconds())
	}
	return k
}

// FirstToken implements FirstTokenObserver.
func (p *PreciseRouter) FirstToken(wr *workload.Request, replica int, now time.Duration) {
	if o, ok := p.inner.(FirstTokenObserver); ok {
		o.FirstToken(wr, replica, now)
	}
}

// Done implements DoneObserver: deltas due by now reach the index before
// the engine's cached_tokens are compared with the prediction.
func (p *PreciseRouter) Done(wr *workload.Request, replica int, cached int, now time.Duration) {
	p.apply(now)
	if o, ok := p.inner.(DoneObserver); ok {
		o.Done(wr, replica, cached, now)
	}
}

// ObserveState implements StateObserver.
func (p *PreciseRouter) ObserveState(st []sim.Stats, now time.Duration) {
	if o, ok := p.inner.(StateObserver); ok {
		o.ObserveState(st, now)
	}
}

// Start implements Scheduler: deltas are applied at their time, as the
// gateway applies a push when it arrives, outside any routing decision.
func (p *PreciseRouter) Start(at func(time.Duration, func(time.Duration))) {
	p.at = at
	if s, ok := p.inner.(Scheduler); ok {
		s.Start(at)
	}
}

// Stats sums the router counters of every worker.
func (p *PreciseRouter) Stats() dispatch.Stats { return routerStats(p.inner) }

// KVEvents implements KVEventObserver: the metrics service's subscriber
// decodes the batch and the engine's bridge turns it into deltas, which
// reach the gateways Delay later.
func (p *PreciseRouter) KVEvents(replica int, payload []byte, now time.Duration) {
	b, err := kvevents.Decode(payload)
	if err != nil {
		p.DecodeErrors++
		return
	}
	p.scratch = p.bridges[replica].Apply(b, now.Milliseconds(), p.scratch[:0])
	for _, d := range p.scratch {
		p.due = append(p.due, dueDelta{at: now + p.Delay, replica: replica, d: d})
	}
	if len(p.scratch) > 0 && p.at != nil {
		p.at(now+p.Delay, p.apply)
	}
}

// apply applies the deltas due by now, in the order they were made, to
// every gateway's index.
func (p *PreciseRouter) apply(now time.Duration) {
	n := 0
	for n < len(p.due) && p.due[n].at <= now {
		n++
	}
	if n == 0 {
		return
	}
	for _, x := range p.due[:n] {
		for _, g := range p.gws {
			g.nowMs = x.at.Milliseconds()
			h := &g.hosts[x.replica]
			applyDelta(g.ix, index.HostRef{Slot: h.Slot, Gen: h.Gen}, x.d)
		}
		p.Applied[x.d.Kind]++
	}
	clear(p.due[:n])
	p.due = append(p.due[:0], p.due[n:]...)
}

// routerStats sums the router counters behind a bench router: one
// RealRouter's, or every worker's of a topology.
func routerStats(r Router) dispatch.Stats {
	var rs []*RealRouter
	switch r := r.(type) {
	case *RealRouter:
		rs = []*RealRouter{r}
	case *TopologyRouter:
		for _, gw := range r.gws {
			rs = append(rs, gw.workers...)
		}
	case *PreciseRouter:
		return routerStats(r.inner)
	case *EndpointRanks:
		return routerStats(r.Inner)
	}
	var s dispatch.Stats
	for _, x := range rs {
		s.Add(x.Stats())
	}
	return s
}

// RouterStats sums the router counters of every worker of a bench router
// (NewStrategy's, NewTopology's or NewPrecise's): the prediction error
// the bench reports.
func RouterStats(r Router) (dispatch.Stats, bool) {
	switch r.(type) {
	case *RealRouter, *TopologyRouter, *PreciseRouter, *EndpointRanks:
		return routerStats(r), true
	}
	return dispatch.Stats{}, false
}

// applyDelta applies one bridged change to a host's blocks (errors are
// the index's contention or a stale host: the next delta or routing
// repairs it, as a lost push would).
func applyDelta(ix *index.Index, ref index.HostRef, d cachestate.Delta) {
	switch d.Kind {
	case cachestate.Stored:
		_ = ix.Stored(ref, d.Chain, d.From)
	case cachestate.Removed:
		_ = ix.Removed(ref, d.Chain, d.From)
	case cachestate.Cleared:
		_ = ix.Clear(ref)
	}
}

// BridgeStats sums the engines' bridges' counters.
func (p *PreciseRouter) BridgeStats() cachestate.Stats {
	var s cachestate.Stats
	for _, b := range p.bridges {
		s.Add(b.Stats())
	}
	return s
}
