package fleet

import (
	"errors"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/workload"
)

// EndpointRanks is a fleet whose endpoints each serve Ranks data-parallel
// ranks (vLLM's --data-parallel-size, SGLang's --dp-size), each rank an
// engine with its own KV cache, routed as a router that does not know the
// ranks routes them: Inner decides among the endpoints, and the endpoint's
// own front end spreads what it gets over its ranks by load alone, the
// rank with the fewest outstanding requests (vLLM's data-parallel balancer
// weighs each rank's waiting and running requests and knows nothing of
// prefixes). Replica e*Ranks+r of the fleet is rank r of endpoint e.
//
// kvroute's own way, each (endpoint, rank) a cache location of its own
// named with x-data-parallel-rank, is the plain fleet of Endpoints*Ranks
// replicas with the router deciding among all of them (NewStrategy).
type EndpointRanks struct {
	Inner Router
	Ranks int

	outstanding []int // per replica: routed, not yet done
	next        []int // per endpoint: the rank ties start from (rotates)
	states      []sim.Stats
}

// NewEndpointRanks wraps inner, a router over endpoints replicas, for a
// fleet of endpoints*ranks engines.
func NewEndpointRanks(inner Router, endpoints, ranks int) (*EndpointRanks, error) {
	if endpoints < 1 || ranks < 1 {
		return nil, errors.New("endpoint ranks: need at least one endpoint and one rank")
	}
	return &EndpointRanks{Inner: inner, Ranks: ranks, outstanding: make([]int, endpoints*ranks),
		next: make([]int, endpoints), states: make([]sim.Stats, endpoints)}, nil
}

// Route picks the endpoint with Inner, then its least-loaded rank.
func (e *EndpointRanks) Route(r *workload.Request, prompt string, now time.Duration) int {
	ep := e.Inner.Route(r, prompt, now)
	base, best := ep*e.Ranks, -1
	for i := range e.Ranks {
		rank := (e.next[ep] + i) % e.Ranks
		if best < 0 || e.outstanding[base+rank] < e.outstanding[base+best] {
			best = rank
		}
	}
	e.next[ep] = (e.next[ep] + 1) % e.Ranks
	e.outstanding[base+best]++
	return base + best
}

// FirstToken implements FirstTokenObserver for Inner, by endpoint.
func (e *EndpointRanks) FirstToken(r *workload.Request, replica int, now time.Duration) {
	if o, ok := e.Inner.(FirstTokenObserver); ok {
		o.FirstToken(r, replica/e.Ranks, now)
	}
}

// Done implements DoneObserver: the rank's request is over; Inner hears of
// it by endpoint.
func (e *EndpointRanks) Done(r *workload.Request, replica int, cached int, now time.Duration) {
	e.outstanding[replica]--
	if o, ok := e.Inner.(DoneObserver); ok {
		o.Done(r, replica/e.Ranks, cached, now)
	}
}

// ObserveState implements StateObserver with each endpoint's state as the
// metrics service pushes an endpoint whose ranks it does not split: queues
// and cache sizes summed, KV usage averaged.
func (e *EndpointRanks) ObserveState(st []sim.Stats, now time.Duration) {
	o, ok := e.Inner.(StateObserver)
	if !ok {
		return
	}
	for ep := range e.states {
		a := sim.Stats{BlockSize: st[ep*e.Ranks].BlockSize, Adapters: st[ep*e.Ranks].Adapters}
		for _, s := range st[ep*e.Ranks : (ep+1)*e.Ranks] {
			a.Waiting += s.Waiting
			a.Running += s.Running
			a.KVUsage += s.KVUsage / float64(e.Ranks)
			a.NumGPUBlocks += s.NumGPUBlocks
			a.CachedBlocks += s.CachedBlocks
			a.MaxLoRAs += s.MaxLoRAs
		}
		e.states[ep] = a
	}
	o.ObserveState(e.states, now)
}
