package fleet

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/workload"
)

const sharedTrace = "../../../../shared/traces/mooncake_synthetic.jsonl"

func loadShared(t testing.TB, opt workload.TraceOptions) *workload.Workload {
	t.Helper()
	if _, err := os.Stat(sharedTrace); err != nil {
		t.Skipf("shared trace not present (%v)", err)
	}
	w, err := workload.LoadMooncake(sharedTrace, opt)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// One replica with unbounded KV sees every prefix it ever computed, so it
// must reach the trace's own ceiling (65.1%, counted in whole 512-token
// trace blocks). The engine counts in 16-token blocks: 512 is a multiple of
// 16, so whole trace blocks are whole engine blocks, and a partial last
// trace block can only add its full 16-token blocks when it repeats. What
// the engine loses is at most one block per request (the last prompt token
// is always recomputed for logits) and prefixes still being prefilled by a
// concurrent request.
func TestSingleReplicaInfiniteCacheReachesTraceCeiling(t *testing.T) {
	w := loadShared(t, workload.TraceOptions{})
	p, _ := sim.LookupProfile("")
	ceiling := workload.CeilingBlocks(w)
	if math.Abs(ceiling-0.651) > 0.001 {
		t.Fatalf("trace ceiling %.4f, the trace README says 65.1%%", ceiling)
	}
	res, err := Run(Config{Replicas: 1, Profile: p, InfiniteKV: true}, w, &RoundRobin{N: 1})
	if err != nil {
		t.Fatal(err)
	}
	s := res.Summarize()
	t.Logf("engine hit ratio %.4f vs trace ceiling %.4f (gap %.2f pp), simulated in %v", s.HitRatio, ceiling, 100*(ceiling-s.HitRatio), res.Wall)
	if math.Abs(s.HitRatio-ceiling) > 0.02 {
		t.Fatalf("single infinite replica hit %.4f, trace ceiling %.4f: more than 2 pp apart", s.HitRatio, ceiling)
	}
	if s.Preemptions != 0 || s.Rejected != 0 {
		t.Fatalf("unbounded KV preempted %d and rejected %d requests", s.Preemptions, s.Rejected)
	}
	if inf := Ceiling(w, p, 0); math.Abs(inf-ceiling) > 0.005 {
		t.Fatalf("unbounded LRU ceiling %.4f far from trace ceiling %.4f", inf, ceiling)
	}
}

func uniformWorkload(n int, rate float64, seed uint64) *workload.Workload {
	rng := rand.New(rand.NewPCG(seed, 9))
	w := &workload.Workload{}
	var t float64
	for i := range n {
		t += rng.ExpFloat64() / rate
		text := workload.PseudoTokens(uint64(i)+1000*seed, 2000)
		w.Requests = append(w.Requests, workload.Request{
			ID: i, Arrival: time.Duration(t * float64(time.Second)), Model: "m",
			Prompt: text, PromptTokens: sim.CountTokens(text), OutputTokens: 100,
		})
	}
	return w
}

func TestRoundRobinSpreadsEvenly(t *testing.T) {
	p, _ := sim.LookupProfile("")
	w := uniformWorkload(800, 40, 1)
	res, err := Run(Config{Replicas: 4, Profile: p}, w, &RoundRobin{N: 4})
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]int, 4)
	for _, r := range res.Records {
		counts[r.Replica]++
	}
	for i, c := range counts {
		if c != 200 {
			t.Fatalf("replica %d got %d of 800 requests, want 200 each", i, c)
		}
	}
	s := res.Summarize()
	if s.LoadImbalance > 1.05 {
		t.Fatalf("identical requests over identical replicas: load imbalance %.3f, want <= 1.05", s.LoadImbalance)
	}
	// A router that sends everything to replica 0 must show the imbalance.
	res, _ = Run(Config{Replicas: 4, Profile: p}, w, routeFunc(func() int { return 0 }))
	if s := res.Summarize(); s.LoadImbalance < 3.9 {
		t.Fatalf("all-to-one routing: imbalance %.3f, want 4", s.LoadImbalance)
	}
}

type routeFunc func() int

func (f routeFunc) Route(*workload.Request, string, time.Duration) int { return f() }

func TestCeilingBoundsEveryRouterAndSharedPrefixRewardsAffinity(t *testing.T) {
	p, _ := sim.LookupProfile("")
	w, err := workload.SharedPrefix{Groups: 8, PromptsPerGroup: 40, SystemTokens: 4000, QuestionTokens: 200, OutputTokens: 50, Rate: 30, Seed: 3}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	ceiling := Ceiling(w, p, 4)
	rr, _ := Run(Config{Replicas: 4, Profile: p}, w, &RoundRobin{N: 4})
	// An oracle-ish affinity router: group by the first 1,000 bytes.
	groups := map[string]int{}
	aff, _ := Run(Config{Replicas: 4, Profile: p}, w, promptRouter(func(prompt string) int {
		k := prompt[:1000]
		if _, ok := groups[k]; !ok {
			groups[k] = len(groups) % 4
		}
		return groups[k]
	}))
	hrr, haff := rr.Summarize().HitRatio, aff.Summarize().HitRatio
	t.Logf("ceiling %.3f, round robin %.3f, affinity %.3f", ceiling, hrr, haff)
	if hrr > ceiling+1e-9 || haff > ceiling+1e-9 {
		t.Fatalf("a router beat the ceiling: ceiling %.4f, rr %.4f, affinity %.4f", ceiling, hrr, haff)
	}
	if haff < hrr+0.05 {
		t.Fatalf("prefix affinity (%.3f) should clearly beat round robin (%.3f) on shared prefixes", haff, hrr)
	}
	if aff.Summarize().TTFT.P50 >= rr.Summarize().TTFT.P50 {
		t.Fatal("more cache hits did not lower median TTFT")
	}
}

type promptRouter func(string) int

func (f promptRouter) Route(_ *workload.Request, prompt string, _ time.Duration) int {
	return f(prompt)
}

func TestObserversSeeEveryRequest(t *testing.T) {
	p, _ := sim.LookupProfile("")
	w := uniformWorkload(100, 20, 2)
	o := &countingRouter{}
	res, err := Run(Config{Replicas: 2, Profile: p, PushInterval: 100 * time.Millisecond}, w, o)
	if err != nil {
		t.Fatal(err)
	}
	if o.first != 100 || o.done != 100 {
		t.Fatalf("first-token %d, done %d observations for 100 requests", o.first, o.done)
	}
	minPushes := int(res.Makespan/(100*time.Millisecond)) - 1
	if o.pushes < minPushes {
		t.Fatalf("%d state pushes over %v, want at least %d", o.pushes, res.Makespan, minPushes)
	}
}

type countingRouter struct{ first, done, pushes, n int }

func (c *countingRouter) Route(*workload.Request, string, time.Duration) int { c.n++; return c.n % 2 }
func (c *countingRouter) FirstToken(*workload.Request, int, time.Duration)   { c.first++ }
func (c *countingRouter) Done(*workload.Request, int, int, time.Duration)    { c.done++ }
func (c *countingRouter) ObserveState(s []sim.Stats, _ time.Duration)        { c.pushes++ }

func TestRouterOutOfRangeIsAnError(t *testing.T) {
	p, _ := sim.LookupProfile("")
	_, err := Run(Config{Replicas: 2, Profile: p}, uniformWorkload(3, 1, 3), routeFunc(func() int { return 5 }))
	if err == nil {
		t.Fatal("router index 5 of 2 replicas accepted")
	}
}
