package fleet

import (
	"container/heap"
	"fmt"
	"math"
	"time"

	"github.com/kvroute/kvroute/internal/metricsvc/kvevents"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/workload"
)

// loop is the one event loop every kind of run shares (Run, RunPD,
// RunAdmitted): requests arrive in trace order, engines step, the metrics
// service pushes state at its interval, and a run mode adds timed events of
// its own (a KV transfer's end, an admission tick) through at. At equal
// times a push comes first, then timed events, then arrivals, then engine
// steps, so every mode orders simultaneous events the same way.
//
// The mode plugs in through three callbacks: arrive (request idx reaches
// the gateway), token (an engine produced a request's first token) and
// finish (an engine finished a request). The loop owns the bookkeeping they
// share: the replicas, the records, the count of finished requests.
type loop struct {
	cfg    Config
	w      *workload.Workload
	reps   []*replica
	res    *Result
	states []sim.Stats
	timers timerHeap
	seq    uint64 // timers at equal times run in the order they were set
	fg     int    // timers that are work of the run (not background)
	done   int
	last   time.Duration // latest completion
	obs    StateObserver
	// kv, when set, receives every engine's KV events as vLLM publishes
	// them (one msgpack EventBatch per engine step, in the map layout on
	// even replicas and the array layout on odd ones).
	kv   KVEventObserver
	encs []kvevents.Encoder

	arrive func(idx int, now time.Duration) error
	token  func(ri int, er *sim.Request, idx int, now time.Duration)
	finish func(ri int, er *sim.Request, idx int, now time.Duration) error
}

// newLoop checks cfg and w, builds the fleet and the result every mode
// fills; obs (may be nil) receives the metrics service's pushes.
func newLoop(cfg Config, w *workload.Workload, obs StateObserver) (*loop, error) {
	reps, err := newReplicas(&cfg, w)
	if err != nil {
		return nil, err
	}
	n := len(w.Requests)
	return &loop{
		cfg: cfg, w: w, reps: reps, obs: obs,
		res:    &Result{Records: make([]Record, n), Busy: make([]time.Duration, cfg.Replicas)},
		states: make([]sim.Stats, cfg.Replicas),
	}, nil
}

// timer is a mode's own event: fn runs at virtual time at.
type timer struct {
	at  time.Duration
	seq uint64
	bg  bool // background: its being pending does not keep the run alive
	fn  func(now time.Duration) error
}

type timerHeap []timer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	return h[i].at < h[j].at || h[i].at == h[j].at && h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)   { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// at schedules fn at virtual time t.
func (l *loop) at(t time.Duration, fn func(now time.Duration) error) {
	l.seq++
	l.fg++
	heap.Push(&l.timers, timer{at: t, seq: l.seq, fn: fn})
}

// background schedules fn at virtual time t as periodic work of a router
// (a gateway's report, a delayed push): it runs while the run lasts but
// does not keep a stalled run going.
func (l *loop) background(t time.Duration, fn func(now time.Duration)) {
	l.seq++
	heap.Push(&l.timers, timer{at: t, seq: l.seq, bg: true, fn: func(now time.Duration) error {
		fn(now)
		return nil
	}})
}

// dispatch routes request idx through r at now and queues it on the chosen
// replica, in engReqs[idx]. Its record keeps arrival as the request's
// arrival (admission routes a request later than it arrived). A request the
// engine refuses is recorded rejected and counted done, and done (may be
// nil) hears of it with no cached tokens.
func (l *loop) dispatch(r Router, done DoneObserver, engReqs []sim.Request, idx int, now, arrival time.Duration) error {
	wr := &l.w.Requests[idx]
	prompt := wr.Text()
	t0 := time.Now()
	k := r.Route(wr, prompt, now)
	rt := time.Since(t0)
	if k < 0 || k >= l.cfg.Replicas {
		return fmt.Errorf("router sent request %d to replica %d of %d", idx, k, l.cfg.Replicas)
	}
	er := &engReqs[idx]
	*er = engineRequest(idx, wr, sim.BlockChain(prompt, l.cfg.Profile.BlockSize), wr.OutputTokens, now)
	rec := &l.res.Records[idx]
	rec.Replica, rec.PromptTokens, rec.OutputTokens, rec.Arrival, rec.RouterTime = k, wr.PromptTokens, wr.OutputTokens, arrival, rt
	if err := l.add(k, er, idx, now); err != nil {
		rec.Rejected = true
		l.done++
		if done != nil {
			done.Done(wr, k, 0, now)
		}
	}
	return nil
}

// add queues er (request idx of the workload) on replica k at now and
// starts the replica stepping if it was idle. The engine's refusal (a
// request that can never fit in its KV memory) is returned.
func (l *loop) add(k int, er *sim.Request, idx int, now time.Duration) error {
	rp := l.reps[k]
	if err := rp.eng.Add(er); err != nil {
		return err
	}
	rp.reqs[er] = idx
	if !rp.stepping {
		l.step(rp, now)
	}
	return nil
}

// finished counts one request done at now.
func (l *loop) finished(now time.Duration) {
	l.done++
	l.last = max(l.last, now)
}

func (l *loop) step(rp *replica, now time.Duration) {
	st := rp.eng.Step(now)
	if st.Duration == 0 {
		rp.stepping = false
		return
	}
	rp.stepping, rp.stepEnd, rp.pending = true, now+st.Duration, st
}

// run replays the workload until every request is finished (or refused),
// then fills the run's totals.
func (l *loop) run() (*Result, error) {
	w, cfg := l.w, l.cfg
	n := len(w.Requests)
	start := time.Now()
	nextPush := time.Duration(0)
	next := 0
	progressEvery := max(1, n/100)
	const never = time.Duration(math.MaxInt64)
	for l.done < n {
		ri := earliestStep(l.reps)
		ta, te, tt := never, never, never
		if next < n {
			ta = w.Requests[next].Arrival
		}
		if ri >= 0 {
			te = l.reps[ri].stepEnd
		}
		if len(l.timers) > 0 {
			tt = l.timers[0].at
		}
		if ri < 0 && next >= n && l.fg == 0 {
			return nil, fmt.Errorf("simulation stalled with %d of %d requests unfinished", n-l.done, n)
		}
		switch {
		case l.obs != nil && nextPush <= ta && nextPush <= te && nextPush <= tt:
			for i, rp := range l.reps {
				l.states[i] = rp.eng.Stats()
			}
			l.obs.ObserveState(l.states, nextPush)
			nextPush += cfg.PushInterval
		case tt <= ta && tt <= te:
			t := heap.Pop(&l.timers).(timer)
			if !t.bg {
				l.fg--
			}
			if err := t.fn(t.at); err != nil {
				return nil, err
			}
		case ta <= te:
			idx := next
			next++
			if err := l.arrive(idx, w.Requests[idx].Arrival); err != nil {
				return nil, err
			}
			if cfg.Progress != nil && (next%progressEvery == 0 || next == n) {
				cfg.Progress(next, n)
			}
		default:
			rp := l.reps[ri]
			now := rp.stepEnd
			st := rp.pending
			if l.token != nil {
				for _, er := range st.Tokens {
					if er.Generated == 1 {
						l.token(ri, er, rp.reqs[er], now)
					}
				}
			}
			for _, er := range st.Finished {
				idx := rp.reqs[er]
				delete(rp.reqs, er)
				if err := l.finish(ri, er, idx, now); err != nil {
					return nil, err
				}
			}
			if l.kv != nil {
				l.publish(ri, now)
			}
			l.step(rp, now)
		}
	}
	l.res.totals(l.reps, l.last-w.Requests[0].Arrival, start)
	return l.res, nil
}

// observeKV makes the engines log their KV events for kv.
func (l *loop) observeKV(kv KVEventObserver) {
	l.kv = kv
	l.encs = make([]kvevents.Encoder, len(l.reps))
	for i, rp := range l.reps {
		rp.eng.EnableKVEvents()
		if i%2 == 1 {
			l.encs[i].Layout = kvevents.ArrayLayout
		}
	}
}

// publish sends replica ri's KV events of the step that ended at now as
// one EventBatch, encoded as vLLM's publisher encodes it.
func (l *loop) publish(ri int, now time.Duration) {
	evs := l.reps[ri].eng.TakeKVEvents()
	if len(evs) == 0 {
		return
	}
	enc := &l.encs[ri]
	sim.EncodeKVEvents(enc, evs)
	l.kv.KVEvents(ri, enc.Batch(now.Seconds()), now)
}

// engineRequest is request idx of w as an engine receives it at now, its
// prompt already cut into the engine's blocks.
func engineRequest(idx int, wr *workload.Request, chain []uint64, maxTokens int, now time.Duration) sim.Request {
	chain = sim.WithAdapter(chain, wr.Adapter)
	return sim.Request{ID: uint64(idx), PromptTokens: wr.PromptTokens, BlockHashes: chain, MaxTokens: maxTokens, Adapter: wr.Adapter, Arrival: now}
}
