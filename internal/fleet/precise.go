package fleet

import (
	"time"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/metricsvc/cachestate"
	"github.com/kvroute/kvroute/internal/metricsvc/kvevents"
	"github.com/kvroute/kvroute/internal/workload"
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
// with the gateway's routing), move the index, as the metrics service's
// pushed deltas do in production. The strategy itself, its index and the
// cached_tokens feedback are the approximate router's, unchanged.
type PreciseRouter struct {
	*RealRouter
	// Delay is DefaultEventDelay unless set before the run.
	Delay time.Duration

	bridges []*cachestate.Bridge
	due     []dueDelta
	scratch []cachestate.Delta
	// DecodeErrors counts batches the decoder refused (a bug: the
	// simulator's engines publish with the same encoder vLLM's format
	// fixtures hold).
	DecodeErrors int
	// Applied counts deltas applied to the index, by kind.
	Applied [3]int
}

type dueDelta struct {
	at      time.Duration
	replica int
	d       cachestate.Delta
}

// NewPrecise wraps a strategy's router with precise cache state.
func NewPrecise(r *RealRouter) *PreciseRouter {
	p := &PreciseRouter{RealRouter: r, Delay: DefaultEventDelay, bridges: make([]*cachestate.Bridge, len(r.hosts))}
	for i := range p.bridges {
		p.bridges[i] = &cachestate.Bridge{Hash: r.ix.Config().Hash}
		// The engine's evictions now arrive as events: the index's own
		// eviction model (a per-host capacity aging out whole recency
		// buckets) would evict heads the engine keeps. A gateway falls
		// back to it for a host whose event stream is down.
		h := &r.hosts[i]
		_ = r.ix.SetCapacity(index.HostRef{Slot: h.Slot, Gen: h.Gen}, 0)
	}
	return p
}

// Route implements Router: pending deltas first, then the decision, which
// the gateway reports to the metrics service's bridge of the chosen engine.
func (p *PreciseRouter) Route(wr *workload.Request, prompt string, now time.Duration) int {
	p.apply(now)
	k := p.RealRouter.Route(wr, prompt, now)
	p.bridges[k].Route(p.hasher.Blocks(), p.hasher.Len(), now.Milliseconds())
	return k
}

// Done implements DoneObserver: deltas due by now reach the index before
// the engine's cached_tokens are compared with the prediction.
func (p *PreciseRouter) Done(wr *workload.Request, replica int, cached int, now time.Duration) {
	p.apply(now)
	p.RealRouter.Done(wr, replica, cached, now)
}

// KVEvents implements KVEventObserver: the metrics service's subscriber
// decodes the batch and the engine's bridge turns it into deltas, which
// reach the gateway Delay later.
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
}

// apply applies the deltas due by now, in the order they were made.
func (p *PreciseRouter) apply(now time.Duration) {
	n := 0
	for n < len(p.due) && p.due[n].at <= now {
		n++
	}
	if n == 0 {
		return
	}
	for _, x := range p.due[:n] {
		p.nowMs = x.at.Milliseconds()
		h := &p.hosts[x.replica]
		applyDelta(p.ix, index.HostRef{Slot: h.Slot, Gen: h.Gen}, x.d)
		p.Applied[x.d.Kind]++
	}
	clear(p.due[:n])
	p.due = append(p.due[:0], p.due[n:]...)
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
		x := b.Stats()
		s.Routes += x.Routes
		s.Expired += x.Expired
		s.Matched += x.Matched
		s.Unmatched += x.Unmatched
		s.Removed += x.Removed
		s.Unmapped += x.Unmapped
		s.Clears += x.Clears
		s.MappedNow += x.MappedNow
		s.PendingNow += x.PendingNow
	}
	return s
}
