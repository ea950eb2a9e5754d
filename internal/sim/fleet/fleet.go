// Package fleet simulates N engine replicas behind a router in virtual time.
//
// It is a discrete-event simulation: the only events are request arrivals,
// engine step completions and periodic state pushes (what `kvroute metrics`
// would send the gateway). Between events nothing changes, so a 17-minute
// trace replays in seconds and every run with the same seed is identical
// except for the router's own wall-clock decision time, which is measured.
//
// The router is a plug-in (Router, plus the optional observer interfaces). The
// benchmark plugs in the real decision code through dispatch, so a
// strategy measured here is the strategy that ships.
package fleet

import (
	"errors"
	"math"
	"sort"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/workload"
)

// Router decides which replica serves each request.
type Router interface {
	// Route picks a replica index in [0, N) for r, which arrives at virtual
	// time now. prompt is the prompt text (for chat, r.Messages holds the
	// messages and prompt is their rendering).
	Route(r *workload.Request, prompt string, now time.Duration) int
}

// FirstTokenObserver is told when a request's first token leaves the engine
// (streaming response headers and first chunk).
type FirstTokenObserver interface {
	FirstToken(r *workload.Request, replica int, now time.Duration)
}

// DoneObserver is told when a request completes, with the cached prompt
// tokens the engine reports in usage.prompt_tokens_details.cached_tokens.
type DoneObserver interface {
	Done(r *workload.Request, replica int, cachedTokens int, now time.Duration)
}

// StateObserver receives every replica's engine state at each push
// interval, as the cluster-metrics service pushes scraped state.
type StateObserver interface {
	ObserveState(states []sim.Stats, now time.Duration)
}

// KVEventObserver receives every engine's KV events: one msgpack
// EventBatch per engine step, byte for byte as vLLM's ZMQ publisher sends
// it (kvevents.Encoder). The payload is valid until the call returns.
type KVEventObserver interface {
	KVEvents(replica int, payload []byte, now time.Duration)
}

// Scheduler is a router with timed work of its own in virtual time (the
// gateways' reports to the metrics service, a push that arrives late):
// Run hands it the loop's scheduler before the first request. Work set
// with at runs at its time while the run lasts and never keeps it going.
type Scheduler interface {
	Start(at func(t time.Duration, fn func(now time.Duration)))
}

// Config describes a fleet run.
type Config struct {
	Replicas int
	Profile  sim.Profile
	// Mixed, when set, makes a heterogeneous fleet: replica i runs
	// Mixed[i % len(Mixed)] instead of Profile.
	Mixed []sim.Profile
	// InfiniteKV gives every replica unbounded KV memory.
	InfiniteKV bool
	// PushInterval is how often StateObserver routers get a snapshot
	// (default 1 s, the metrics service's default scrape interval).
	PushInterval time.Duration
	// Progress, when set, is called with the number of requests routed so
	// far, about every 1% of the workload.
	Progress func(done, total int)
}

// Record is one request's outcome.
type Record struct {
	Replica      int
	PromptTokens int
	OutputTokens int
	CachedTokens int
	Arrival      time.Duration
	TTFT         time.Duration
	E2E          time.Duration
	TPOT         time.Duration // 0 when only one token was generated
	RouterTime   time.Duration // wall clock spent in Route
	Preemptions  int
	Rejected     bool // the engine refused it (could never fit in KV)
}

// Result is a whole run.
type Result struct {
	Records     []Record
	Busy        []time.Duration // per replica
	Preemptions int64
	Makespan    time.Duration // first arrival to last completion
	Wall        time.Duration
}

type replica struct {
	eng      *sim.Engine
	stepping bool
	stepEnd  time.Duration
	pending  *sim.StepResult
	reqs     map[*sim.Request]int // engine request -> workload index
}

// newReplicas checks what every kind of run needs (a replica, a request),
// applies cfg's defaults and builds a fresh fleet of engines.
func newReplicas(cfg *Config, w *workload.Workload) ([]*replica, error) {
	if cfg.Replicas < 1 {
		return nil, errors.New("fleet needs at least one replica")
	}
	if len(w.Requests) == 0 {
		return nil, errors.New("workload has no requests")
	}
	if cfg.PushInterval <= 0 {
		cfg.PushInterval = time.Second
	}
	var opts []sim.Option
	if cfg.InfiniteKV {
		opts = append(opts, sim.WithInfiniteKV())
	}
	reps := make([]*replica, cfg.Replicas)
	for i := range reps {
		p := cfg.Profile
		if len(cfg.Mixed) > 0 {
			p = cfg.Mixed[i%len(cfg.Mixed)]
		}
		reps[i] = &replica{eng: sim.NewEngine(p, opts...), reqs: map[*sim.Request]int{}}
	}
	return reps, nil
}

// totals fills what a run knows only at its end: each replica's busy time
// and preemptions, the span from first arrival to last completion, and the
// wall time the simulation took since start.
func (res *Result) totals(reps []*replica, makespan time.Duration, start time.Time) {
	for i, rp := range reps {
		s := rp.eng.Stats()
		res.Busy[i] = s.Busy
		res.Preemptions += s.Preemptions
	}
	res.Makespan = makespan
	res.Wall = time.Since(start)
}

// earliestStep returns the replica whose running step ends first, or -1
// when no replica is stepping: the next engine event of the simulation.
func earliestStep(reps []*replica) int {
	ri := -1
	for i, rp := range reps {
		if rp.stepping && (ri < 0 || rp.stepEnd < reps[ri].stepEnd) {
			ri = i
		}
	}
	return ri
}

// setTimes fills a finished request's latencies, counted from arrival (the
// engine's arrival, or the gateway's when the request was held first).
func (rec *Record) setTimes(er *sim.Request, arrival time.Duration) {
	rec.TTFT = er.FirstToken - arrival
	rec.E2E = er.Finished - arrival
	if er.Generated > 1 {
		rec.TPOT = (er.Finished - er.FirstToken) / time.Duration(er.Generated-1)
	}
}

// Run replays w through the router on a fresh fleet.
func Run(cfg Config, w *workload.Workload, router Router) (*Result, error) {
	firstObs, _ := router.(FirstTokenObserver)
	doneObs, _ := router.(DoneObserver)
	stateObs, _ := router.(StateObserver)
	l, err := newLoop(cfg, w, stateObs)
	if err != nil {
		return nil, err
	}
	if kv, ok := router.(KVEventObserver); ok {
		l.observeKV(kv)
	}
	if sc, ok := router.(Scheduler); ok {
		sc.Start(l.background)
	}
	res := l.res
	engReqs := make([]sim.Request, len(w.Requests))
	l.arrive = func(idx int, now time.Duration) error {
		return l.dispatch(router, doneObs, engReqs, idx, now, now)
	}
	if firstObs != nil {
		l.token = func(ri int, _ *sim.Request, idx int, now time.Duration) {
			firstObs.FirstToken(&w.Requests[idx], ri, now)
		}
	}
	l.finish = func(ri int, er *sim.Request, idx int, now time.Duration) error {
		rec := &res.Records[idx]
		rec.CachedTokens = er.CachedTokens
		rec.setTimes(er, er.Arrival)
		rec.Preemptions = er.Preemptions
		l.finished(now)
		if doneObs != nil {
			doneObs.Done(&w.Requests[idx], ri, er.CachedTokens, now)
		}
		return nil
	}
	return l.run()
}

// Summary is a run reduced to the bench contract's figures.
type Summary struct {
	Requests      int
	Rejected      int
	TTFT          Percentiles
	TPOT          Percentiles
	E2E           Percentiles
	RouterTime    Percentiles
	OutputTokPerS float64
	HitRatio      float64 // cached input tokens over all input tokens
	LoadImbalance float64 // max over mean of per-replica busy time
	Preemptions   int64
}

// Percentiles of a duration distribution.
type Percentiles struct{ P50, P90, P99 time.Duration }

// Summarize reduces a run.
func (r *Result) Summarize() Summary {
	var s Summary
	var ttft, tpot, e2e, rt []time.Duration
	var cached, input, output int64
	for _, rec := range r.Records {
		s.Requests++
		input += int64(rec.PromptTokens)
		rt = append(rt, rec.RouterTime)
		if rec.Rejected {
			s.Rejected++
			continue
		}
		cached += int64(rec.CachedTokens)
		output += int64(rec.OutputTokens)
		ttft = append(ttft, rec.TTFT)
		e2e = append(e2e, rec.E2E)
		if rec.OutputTokens > 1 {
			tpot = append(tpot, rec.TPOT)
		}
	}
	s.TTFT, s.TPOT, s.E2E, s.RouterTime = percentiles(ttft), percentiles(tpot), percentiles(e2e), percentiles(rt)
	if input > 0 {
		s.HitRatio = float64(cached) / float64(input)
	}
	if r.Makespan > 0 {
		s.OutputTokPerS = float64(output) / r.Makespan.Seconds()
	}
	s.LoadImbalance = Imbalance(r.Busy)
	s.Preemptions = r.Preemptions
	return s
}

// Imbalance is max over mean of per-replica busy time (1 is perfectly even).
func Imbalance(busy []time.Duration) float64 {
	var sum, mx time.Duration
	for _, b := range busy {
		sum += b
		mx = max(mx, b)
	}
	if sum == 0 {
		return 1
	}
	return float64(mx) / (float64(sum) / float64(len(busy)))
}

func percentiles(d []time.Duration) Percentiles {
	if len(d) == 0 {
		return Percentiles{}
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return Percentiles{P50: quantile(d, 0.50), P90: quantile(d, 0.90), P99: quantile(d, 0.99)}
}

// quantile of sorted data by the nearest-rank method.
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Ceiling is the hit ratio of one LRU prefix cache holding the whole fleet's
// KV capacity (replicas x the profile's blocks), replaying the requests in
// arrival order: no router can do better on that fleet, since any routing
// splits the same capacity into replicas. replicas <= 0 means an unbounded
// cache (the workload's own ceiling).
func Ceiling(w *workload.Workload, p sim.Profile, replicas int) float64 {
	blocks := 0
	if replicas > 0 {
		blocks = replicas * p.NumGPUBlocks()
	}
	lru := sim.NewPrefixLRU(blocks, p.BlockSize)
	var cached, input int64
	for i := range w.Requests {
		r := &w.Requests[i]
		cached += int64(lru.Serve(sim.BlockChain(r.Text(), p.BlockSize), r.PromptTokens))
		input += int64(r.PromptTokens)
	}
	if input == 0 {
		return 0
	}
	return float64(cached) / float64(input)
}
