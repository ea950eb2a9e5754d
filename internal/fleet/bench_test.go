package fleet

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/workload"
)

// BenchmarkTraceReplay replays the whole shared trace on 8 replicas, once
// with a bare round robin (the simulator's own cost: events, engine steps,
// prompt expansion and engine hashing) and once with kv_cache_aware through
// internal/router and the index (adding the router's hashing, queries and
// records), in the same run, and reports both wall times and their ratio.
// The bound: the whole trace within 60 s of wall time.
func BenchmarkTraceReplay(b *testing.B) {
	w := loadShared(b, workload.TraceOptions{})
	p, _ := sim.LookupProfile("")
	var base, real time.Duration
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
		real += res.Wall
	}
	n := float64(b.N)
	b.ReportMetric(base.Seconds()/n, "s/replay-baseline")
	b.ReportMetric(real.Seconds()/n, "s/replay-kv_cache_aware")
	b.ReportMetric(float64(real)/float64(base), "ratio")
}

// BenchmarkEngineStep measures one decode-heavy engine step (64 running
// requests) against computing the step's cost alone, in the same run.
func BenchmarkEngineStep(b *testing.B) {
	p, _ := sim.LookupProfile("")
	e := sim.NewEngine(p)
	for i := range 64 {
		e.Add(&sim.Request{ID: uint64(i), PromptTokens: 2000, MaxTokens: 1 << 30})
	}
	now := time.Duration(0)
	for !func() bool { st := e.Step(now); now += st.Duration; return e.Stats().PromptTokens >= 64*2000 }() {
	}
	work := make([]sim.SeqWork, 64)
	for i := range work {
		work[i] = sim.SeqWork{Context: 2000, NewTokens: 1}
	}
	var step, cost time.Duration
	for range b.N {
		t0 := time.Now()
		st := e.Step(now)
		now += st.Duration
		t1 := time.Now()
		_ = p.StepTime(work)
		cost += time.Since(t1)
		step += t1.Sub(t0)
	}
	b.ReportMetric(float64(step.Nanoseconds())/float64(b.N), "ns/step")
	b.ReportMetric(float64(cost.Nanoseconds())/float64(b.N), "ns/costmodel")
	b.ReportMetric(float64(step)/float64(max(cost, 1)), "ratio")
}
