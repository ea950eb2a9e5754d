package fleet

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/workload"
)

// BenchmarkTraceReplay replays the whole shared trace on 8 replicas, once
// with a bare round robin (the simulator's own cost: events, engine steps,
// prompt expansion and engine hashing) and once with kv_cache_aware through
// dispatch and the index (adding the router's hashing, queries and
// records), in the same run, and reports both wall times and their ratio.
// The bound: the whole trace within 60 s of wall time.
func BenchmarkTraceReplay(b *testing.B) {
	w := loadShared(b, workload.TraceOptions{})
	p, _ := sim.LookupProfile("")
	var base, withRouter time.Duration
	for range b.N {
		res, err := Run(Config{Replicas: 8, Profile: p}, w, &RoundRobin{N: 8})
		if err != nil {
			b.Fatal(err)
		}
		base += res.Wall
		r, err := NewStrategy("kv_cache_aware", 8, StrategyOptions{Seed: 1, Profile: p})
		if err != nil {
			b.Fatal(err)
		}
		res, err = Run(Config{Replicas: 8, Profile: p}, w, r)
		if err != nil {
			b.Fatal(err)
		}
		withRouter += res.Wall
	}
	n := float64(b.N)
	b.ReportMetric(base.Seconds()/n, "s/replay-baseline")
	b.ReportMetric(withRouter.Seconds()/n, "s/replay-kv_cache_aware")
	b.ReportMetric(float64(withRouter)/float64(base), "ratio")
}

// BenchmarkEngineStep measures one decode step of 64 running requests
// (scheduling, block accounting, progress) against computing that step's
// cost alone, in the same run.
func BenchmarkEngineStep(b *testing.B) {
	p, _ := sim.LookupProfile("")
	p.NumGPUBlocksOverride = 1 << 17
	const fresh = 20000 // steps before the requests would outgrow the KV
	var e *sim.Engine
	var now time.Duration
	reset := func() {
		e = sim.NewEngine(p)
		for i := range 64 {
			if err := e.Add(&sim.Request{ID: uint64(i), PromptTokens: 2000, MaxTokens: fresh + 100}); err != nil {
				b.Fatal(err)
			}
		}
		for e.Stats().GenerationTokens < 64 { // every request past its prefill
			now += e.Step(now).Duration
		}
	}
	work := make([]sim.SeqWork, 64)
	for i := range work {
		work[i] = sim.SeqWork{Context: 2000, NewTokens: 1}
	}
	var step, cost time.Duration
	for i := range b.N {
		if i%fresh == 0 {
			reset()
		}
		t0 := time.Now()
		now += e.Step(now).Duration
		t1 := time.Now()
		_ = p.StepTime(work)
		cost += time.Since(t1)
		step += t1.Sub(t0)
	}
	b.ReportMetric(float64(step.Nanoseconds())/float64(b.N), "ns/step")
	b.ReportMetric(float64(cost.Nanoseconds())/float64(b.N), "ns/costmodel")
	b.ReportMetric(float64(step)/float64(max(cost, 1)), "ratio")
}
