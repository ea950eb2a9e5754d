package fleet

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/workload"
)

// The engine's balancer gives each request of an endpoint to its rank with
// the fewest outstanding requests (ties rotate), and the inner router
// hears of replicas as endpoints.
func TestEndpointRanksBalancesRanksByLoad(t *testing.T) {
	inner := &fixedRouter{to: 1}
	e, err := NewEndpointRanks(inner, 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	r := &workload.Request{}
	var got []int
	for range 4 {
		got = append(got, e.Route(r, "", 0))
	}
	// Endpoint 1 is replicas 3, 4, 5: each rank once, then the rotation.
	if got[0] == got[1] || got[1] == got[2] || got[0] == got[2] || got[0] < 3 || got[3] > 5 {
		t.Fatalf("four requests to endpoint 1 went to replicas %v, want ranks 3, 4, 5 each once first", got)
	}
	e.Done(r, got[1], 0, time.Second)
	e.Done(r, got[1], 0, time.Second) // now the least loaded
	if next := e.Route(r, "", 0); next != got[1] {
		t.Errorf("after two completions on replica %d the next request went to %d", got[1], next)
	}
	if inner.done != 2 || inner.lastDone != 1 {
		t.Errorf("inner router told of %d completions, last on replica %d; want 2 on endpoint 1", inner.done, inner.lastDone)
	}
	e.ObserveState([]sim.Stats{{}, {}, {}, {Waiting: 1, KVUsage: 0.5}, {Waiting: 2, KVUsage: 0.1}, {Running: 4}}, time.Second)
	if s := inner.state; len(s) != 2 || s[1].Waiting != 3 || s[1].Running != 4 || s[1].KVUsage < 0.199 || s[1].KVUsage > 0.201 {
		t.Errorf("endpoint states %+v, want endpoint 1 with 3 waiting, 4 running, KV usage 0.2", s)
	}
}

type fixedRouter struct {
	to, done, lastDone int
	state              []sim.Stats
}

func (f *fixedRouter) Route(*workload.Request, string, time.Duration) int { return f.to }
func (f *fixedRouter) Done(_ *workload.Request, replica int, _ int, _ time.Duration) {
	f.done, f.lastDone = f.done+1, replica
}
func (f *fixedRouter) ObserveState(st []sim.Stats, _ time.Duration) { f.state = st }

// Engines with data-parallel ranks: kvroute routing each (endpoint, rank)
// as a cache location keeps each prefix group on one rank's cache; a
// router that sees only endpoints, whose balancer then spreads requests
// over the ranks by load, recomputes the same prefixes on several ranks.
// The same strategy, workload and engines: per-rank routing hits more.
func TestPerRankRoutingBeatsPerEndpoint(t *testing.T) {
	w, err := workload.SharedPrefix{Groups: 24, PromptsPerGroup: 12, SystemTokens: 3000, QuestionTokens: 100,
		OutputTokens: 20, Rate: 20, Seed: 1}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := sim.LookupProfile("")
	const endpoints, ranks = 2, 2
	perRank, err := NewStrategy("kv_cache_aware", endpoints*ranks, StrategyOptions{Seed: 1, Profile: p})
	if err != nil {
		t.Fatal(err)
	}
	ep := p
	ep.NumGPUBlocksOverride = p.NumGPUBlocks() * ranks
	inner, err := NewStrategy("kv_cache_aware", endpoints, StrategyOptions{Seed: 1, Profile: ep})
	if err != nil {
		t.Fatal(err)
	}
	perEndpoint, err := NewEndpointRanks(inner, endpoints, ranks)
	if err != nil {
		t.Fatal(err)
	}
	var hit [2]float64
	for i, r := range []Router{perRank, perEndpoint} {
		res, err := Run(Config{Replicas: endpoints * ranks, Profile: p}, w, r)
		if err != nil {
			t.Fatal(err)
		}
		hit[i] = res.Summarize().HitRatio
	}
	t.Logf("hit ratio per rank %.3f, per endpoint %.3f", hit[0], hit[1])
	if hit[0] <= hit[1]+0.02 {
		t.Errorf("per-rank routing hit %.3f, per-endpoint %.3f: want per rank ahead by more than 2 points", hit[0], hit[1])
	}
}
