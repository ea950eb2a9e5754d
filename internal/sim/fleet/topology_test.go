package fleet

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/workload"
)

func topoRun(t *testing.T, name string, w *workload.Workload, replicas int, top Topology) (*Result, *TopologyRouter) {
	t.Helper()
	p, _ := sim.LookupProfile("")
	tr, err := NewTopology(name, replicas, StrategyOptions{Seed: 3, Profile: p}, top)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(Config{Replicas: replicas, Profile: p}, w, tr)
	if err != nil {
		t.Fatal(err)
	}
	return res, tr
}

// Requests reach every worker of every gateway: at random, or in turn
// (then evenly, to within one request per gateway).
func TestTopologySpreadsRequestsOverEveryWorker(t *testing.T) {
	w := uniformWorkload(240, 40, 2)
	for _, rr := range []bool{false, true} {
		_, tr := topoRun(t, "least_request", w, 4, Topology{Gateways: 2, Workers: 3, RoundRobin: rr, Seed: 1})
		total := 0
		for gi, gw := range tr.gws {
			for wi, r := range gw.workers {
				d := int(r.Stats().Decisions)
				total += d
				if d == 0 || rr && d != 40 {
					t.Errorf("round robin %v: gateway %d worker %d decided %d of 240", rr, gi, wi, d)
				}
			}
		}
		if total != 240 {
			t.Fatalf("workers decided %d requests of 240", total)
		}
	}
}

// replicasPerConversation counts the distinct replicas each conversation's
// follow-ups went to other than its first turn's; it returns the
// follow-ups and how many of them left their first turn's replica.
func followUpsMoved(w *workload.Workload, res *Result) (followUps, moved int) {
	first := map[string]int{}
	for i, r := range w.Requests {
		k := res.Records[i].Replica
		if f, ok := first[r.Session]; !ok {
			first[r.Session] = k
		} else {
			followUps++
			if f != k {
				moved++
			}
		}
	}
	return followUps, moved
}

// One gateway is one router whatever its worker count: with 4 workers and
// every turn on a connection of its own, a conversation's follow-ups stay
// on its first turn's host, because the session pins live in the
// gateway's shared data. Kept per worker, most of them move.
func TestOneGatewayKeepsSessionsWhateverItsWorkers(t *testing.T) {
	w, err := workload.MultiTurn{Users: 40, Rounds: 4, SystemTokens: 300, QuestionTokens: 100, OutputTokens: 20,
		Rate: 4, ThinkTime: 2 * time.Second, Seed: 5}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	top := Topology{Gateways: 1, Workers: 4, Seed: 2}
	res, _ := topoRun(t, "sticky_session", w, 4, top)
	n, moved := followUpsMoved(w, res)
	if n != 120 || moved > n/20 {
		t.Fatalf("shared pins: %d of %d follow-ups left their session's host", moved, n)
	}
	top.perWorker = true
	res, _ = topoRun(t, "sticky_session", w, 4, top)
	if _, movedLocal := followUpsMoved(w, res); movedLocal < n/3 {
		t.Fatalf("per-worker pins moved only %d of %d follow-ups: the test no longer tells the two apart", movedLocal, n)
	} else {
		t.Logf("follow-ups that left their host: %d of %d with shared pins, %d with per-worker pins", moved, n, movedLocal)
	}
}

// groupsSpread is the mean number of replicas each shared-prefix group
// was sent to.
func groupsSpread(w *workload.Workload, res *Result) float64 {
	groups := map[string]map[int]bool{}
	for i := range w.Requests {
		key := w.Requests[i].Text()[:2000]
		if groups[key] == nil {
			groups[key] = map[int]bool{}
		}
		groups[key][res.Records[i].Replica] = true
	}
	total := 0
	for _, g := range groups {
		total += len(g)
	}
	return float64(total) / float64(len(groups))
}

// Several gateways converge through their reports: a shared-prefix group
// stays on about as few hosts with 3 gateways as with one, where gateways
// that know only their own traffic each place it on a host of their own.
func TestGatewayReportsKeepGroupsTogether(t *testing.T) {
	w, err := workload.SharedPrefix{Groups: 12, PromptsPerGroup: 20, SystemTokens: 3000, QuestionTokens: 100,
		OutputTokens: 20, Rate: 20, Seed: 4}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	one, _ := topoRun(t, "kv_cache_aware", w, 6, Topology{Gateways: 1, Workers: 1})
	with, tr := topoRun(t, "kv_cache_aware", w, 6, Topology{Gateways: 3, Workers: 2, Seed: 1})
	without, _ := topoRun(t, "kv_cache_aware", w, 6, Topology{Gateways: 3, Workers: 2, Seed: 1, NoReports: true})
	s1, sw, so := groupsSpread(w, one), groupsSpread(w, with), groupsSpread(w, without)
	t.Logf("replicas per group: 1 gateway %.2f, 3 gateways with reports %.2f, without %.2f (%d reports applied)", s1, sw, so, tr.Reports)
	if tr.Reports == 0 {
		t.Fatal("no report was applied")
	}
	if sw > s1+0.5 || so < sw+0.5 {
		t.Fatalf("replicas per group: 1 gateway %.2f, 3 with reports %.2f, 3 without %.2f", s1, sw, so)
	}
	h1, hw := one.Summarize().HitRatio, with.Summarize().HitRatio
	if hw < 0.95*h1 {
		t.Fatalf("3 gateways hit %.3f, one gateway %.3f", hw, h1)
	}
}

// Load stays honest across gateways: with the other gateways' in-flight
// counts and pending tokens merged in, 4 gateways routing for cache and
// load spread the traffic nearly as one gateway would; counting only their
// own requests, each sends its share of a prefix's traffic to a host the
// others are already loading.
func TestGatewaysSeeEachOthersLoad(t *testing.T) {
	w := uniformWorkload(1200, 30, 7)
	top := Topology{Gateways: 4, Workers: 2, Seed: 1}
	one, _ := topoRun(t, "kv_cache_aware", w, 4, Topology{Gateways: 1, Workers: 1})
	honest, _ := topoRun(t, "kv_cache_aware", w, 4, top)
	top.noRemoteLoad = true
	blind, _ := topoRun(t, "kv_cache_aware", w, 4, top)
	p1, ph, pb := one.Summarize().TTFT.P90, honest.Summarize().TTFT.P90, blind.Summarize().TTFT.P90
	t.Logf("TTFT p90: 1 gateway %v, 4 gateways with merged load %v, own load only %v", p1, ph, pb)
	if ph > pb*9/10 {
		t.Fatalf("merged load gave TTFT p90 %v, own load only %v: not 10%% better", ph, pb)
	}
}
