package fleet

// Prefill/decode disaggregation in the fleet simulator (kvroute.pd's bench,
// issue 7). This file is owned by the pd filter's engineer; it adds to the
// package without changing Run.
//
// A disaggregated request lives three lives in virtual time, as it does
// behind kvroute.pd with vLLM's NixlConnector:
//
//  1. prefill: the prompt runs on a prefill replica with one output token
//     (the token is thrown away, as the pd filter throws the prefill
//     response away after reading its kv_transfer_params);
//  2. KV transfer: the prompt's KV cache, less what the decode replica's
//     own prefix cache holds when the prefill ends, crosses the network at
//     PDConfig.KVTransferBandwidth plus a fixed per-transfer latency;
//  3. decode: the request joins the decode replica with its KV already
//     there (sim.Request.KVTransferred: one prompt token recomputed for
//     logits) and generates every output token. TTFT is the decode's first
//     token, the first byte the client sees.
//
// Requests the router does not disaggregate (below the threshold, or no
// prefill host) go straight to the decode replica, which prefills them
// itself.

import (
	"container/heap"
	"fmt"
	"math"
	"time"

	"github.com/kvroute/kvroute/internal/router"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/workload"
	"github.com/kvroute/kvroute/scorer"
)

// PDRouter decides for a disaggregated fleet: the decode replica and, when
// the request is split, the prefill replica (-1 when the decode replica
// prefills it itself).
type PDRouter interface {
	RoutePD(r *workload.Request, prompt string, now time.Duration) (decode, prefill int)
}

// PDConfig describes a disaggregated fleet run.
type PDConfig struct {
	Config
	// Roles gives each replica's role (len Replicas). Requests are only
	// prefilled on RolePrefill replicas by the router's choice; the
	// simulator enforces nothing.
	Roles []scorer.Role
	// KVTransferBandwidth is bytes/s per transfer (default 50e9, a 400 Gb/s
	// RDMA NIC, the simulated engines' default).
	KVTransferBandwidth float64
	// KVTransferLatency is added to every transfer (handshake, block
	// lookup); default 0.
	KVTransferLatency time.Duration
}

// PDResult is a disaggregated run: the usual Result (Records hold the
// decode replica, the prefill replica's cached tokens when split, and
// end-to-end times from arrival) plus the split's own figures.
type PDResult struct {
	*Result
	// Disaggregated counts requests prefilled on a prefill replica.
	Disaggregated int
	// Prefill is the prefill replica per request (-1 when not split).
	Prefill []int
	// Transfer sums the KV transfer time of all split requests.
	Transfer time.Duration
}

type transfer struct {
	at  time.Duration
	idx int
}

type transferHeap []transfer

func (h transferHeap) Len() int           { return len(h) }
func (h transferHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h transferHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *transferHeap) Push(x any)        { *h = append(*h, x.(transfer)) }
func (h *transferHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// RunPD replays w through a disaggregating router on a fresh fleet.
func RunPD(cfg PDConfig, w *workload.Workload, rt PDRouter) (*PDResult, error) {
	if len(cfg.Roles) != cfg.Replicas {
		return nil, fmt.Errorf("%d roles for %d replicas", len(cfg.Roles), cfg.Replicas)
	}
	reps, err := newReplicas(&cfg.Config, w)
	if err != nil {
		return nil, err
	}
	if cfg.KVTransferBandwidth <= 0 {
		cfg.KVTransferBandwidth = 50e9
	}
	firstObs, _ := rt.(FirstTokenObserver)
	doneObs, _ := rt.(DoneObserver)
	stateObs, _ := rt.(StateObserver)

	start := time.Now()
	n := len(w.Requests)
	res := &PDResult{Result: &Result{Records: make([]Record, n), Busy: make([]time.Duration, cfg.Replicas)}, Prefill: make([]int, n)}
	prefillReqs := make([]sim.Request, n)
	decodeReqs := make([]sim.Request, n)
	chains := make([][]uint64, n)
	inPrefill := make([]bool, n)
	states := make([]sim.Stats, cfg.Replicas)
	var transfers transferHeap
	nextPush := time.Duration(0)
	next, done := 0, 0
	progressEvery := max(1, n/100)
	bs := cfg.Profile.BlockSize
	kvBytes := cfg.Profile.KVBytesPerToken()
	first := w.Requests[0].Arrival
	var last time.Duration

	startStep := func(rp *replica, now time.Duration) {
		st := rp.eng.Step(now)
		if st.Duration == 0 {
			rp.stepping = false
			return
		}
		rp.stepping, rp.stepEnd, rp.pending = true, now+st.Duration, st
	}
	finish := func(idx, k int, er *sim.Request, now time.Duration, rejected bool) {
		rec := &res.Records[idx]
		done++
		last = max(last, now)
		if rejected {
			rec.Rejected = true
			if doneObs != nil {
				doneObs.Done(&w.Requests[idx], k, 0, now)
			}
			return
		}
		if res.Prefill[idx] < 0 {
			rec.CachedTokens = er.CachedTokens
		} // split: the prefill replica's prefix hits, set at prefill end
		rec.setTimes(er, w.Requests[idx].Arrival)
		rec.Preemptions += er.Preemptions
		if doneObs != nil {
			doneObs.Done(&w.Requests[idx], k, rec.CachedTokens, now)
		}
	}
	// toDecode queues request idx on its decode replica at now.
	toDecode := func(idx int, now time.Duration, transferred bool) {
		wr := &w.Requests[idx]
		k := res.Records[idx].Replica
		er := &decodeReqs[idx]
		*er = sim.Request{ID: uint64(idx), PromptTokens: wr.PromptTokens, BlockHashes: chains[idx],
			MaxTokens: wr.OutputTokens, Arrival: now, KVTransferred: transferred}
		rp := reps[k]
		if err := rp.eng.Add(er); err != nil {
			finish(idx, k, er, now, true)
			return
		}
		rp.reqs[er] = idx
		if !rp.stepping {
			startStep(rp, now)
		}
	}

	for done < n {
		ri := earliestStep(reps)
		ta, te, tt := time.Duration(math.MaxInt64), time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
		if next < n {
			ta = w.Requests[next].Arrival
		}
		if ri >= 0 {
			te = reps[ri].stepEnd
		}
		if len(transfers) > 0 {
			tt = transfers[0].at
		}
		if ri < 0 && next >= n && len(transfers) == 0 {
			return nil, fmt.Errorf("simulation stalled with %d of %d requests unfinished", n-done, n)
		}
		if stateObs != nil && nextPush <= ta && nextPush <= te && nextPush <= tt {
			for i, rp := range reps {
				states[i] = rp.eng.Stats()
			}
			stateObs.ObserveState(states, nextPush)
			nextPush += cfg.PushInterval
			continue
		}
		switch {
		case tt <= ta && tt <= te:
			tr := heap.Pop(&transfers).(transfer)
			toDecode(tr.idx, tr.at, true)
		case ta <= te:
			idx := next
			wr := &w.Requests[idx]
			now := wr.Arrival
			prompt := wr.Text()
			t0 := time.Now()
			k, p := rt.RoutePD(wr, prompt, now)
			took := time.Since(t0)
			if k < 0 || k >= cfg.Replicas || p >= cfg.Replicas {
				return nil, fmt.Errorf("router sent request %d to decode %d, prefill %d of %d replicas", idx, k, p, cfg.Replicas)
			}
			chains[idx] = sim.BlockChain(prompt, bs)
			rec := &res.Records[idx]
			rec.Replica, rec.PromptTokens, rec.OutputTokens, rec.Arrival, rec.RouterTime = k, wr.PromptTokens, wr.OutputTokens, now, took
			res.Prefill[idx] = -1
			if p >= 0 {
				er := &prefillReqs[idx]
				*er = sim.Request{ID: uint64(idx), PromptTokens: wr.PromptTokens, BlockHashes: chains[idx], MaxTokens: 1, Arrival: now}
				if err := reps[p].eng.Add(er); err == nil {
					res.Prefill[idx] = p
					res.Disaggregated++
					inPrefill[idx] = true
					reps[p].reqs[er] = idx
					if !reps[p].stepping {
						startStep(reps[p], now)
					}
				}
			}
			if res.Prefill[idx] < 0 {
				// Not split, or the prefill replica refused it: decode-only,
				// as kvroute.pd falls back.
				toDecode(idx, now, false)
			}
			next++
			if cfg.Progress != nil && (next%progressEvery == 0 || next == n) {
				cfg.Progress(next, n)
			}
		default:
			rp := reps[ri]
			now := rp.stepEnd
			st := rp.pending
			for _, er := range st.Tokens {
				idx := rp.reqs[er]
				if er.Generated == 1 && firstObs != nil && er != &prefillReqs[idx] {
					firstObs.FirstToken(&w.Requests[idx], res.Records[idx].Replica, now)
				}
			}
			for _, er := range st.Finished {
				idx := rp.reqs[er]
				delete(rp.reqs, er)
				if inPrefill[idx] && er == &prefillReqs[idx] {
					inPrefill[idx] = false
					res.Records[idx].CachedTokens = er.CachedTokens
					res.Records[idx].Preemptions = er.Preemptions
					// The decode engine pulls only the blocks its own prefix
					// cache lacks (vLLM's connector matches locally first).
					pull := max(er.PromptTokens-reps[res.Records[idx].Replica].eng.PeekCached(chains[idx]), 0)
					d := cfg.KVTransferLatency + time.Duration(float64(pull)*kvBytes/cfg.KVTransferBandwidth*float64(time.Second))
					res.Transfer += d
					heap.Push(&transfers, transfer{at: now + d, idx: idx})
					continue
				}
				finish(idx, res.Records[idx].Replica, er, now, false)
			}
			startStep(rp, now)
		}
	}
	res.totals(reps, last-first, start)
	return res, nil
}

// NewPDStrategy returns a router for a disaggregated fleet: replicas with
// RolePrefill prefill, the others decode, and the handler comes from a
// plugin configuration with a "disaggregation" object (the same JSON the
// Envoy filter reads), e.g.
//
//	{"strategy":"kv_cache_aware","disaggregation":{"prefillStrategy":"kv_cache_aware","threshold":512}}
//
// Without "disaggregation" it never splits, which makes it the aggregated
// baseline over the same code.
func NewPDStrategy(name string, roles []scorer.Role, opt StrategyOptions) (*PDRealRouter, error) {
	r, err := NewStrategy(name, len(roles), opt)
	if err != nil {
		return nil, err
	}
	a := r.(*RealRouter)
	for i, role := range roles {
		a.hosts[i].Role = role
	}
	return &PDRealRouter{RealRouter: a}, nil
}

// PDRealRouter is RealRouter deciding prefill too, as kvroute.router does
// before it hands the prefill host to kvroute.pd.
type PDRealRouter struct {
	*RealRouter
	// Decisions and Split count decisions and split ones.
	Decisions, Split int
}

// RoutePD implements PDRouter.
func (a *PDRealRouter) RoutePD(wr *workload.Request, prompt string, now time.Duration) (int, int) {
	in := a.input(wr, prompt, now)
	t, _ := a.r.Decide(in, a.hosts)
	a.Decisions++
	if t.Host < 0 {
		a.FailedOpen++
		return firstDecode(a.hosts), -1
	}
	if a.tickets == nil {
		a.tickets = map[int]*router.Ticket{}
	}
	a.tickets[wr.ID] = &t
	if t.Prefill >= 0 {
		a.Split++
	}
	return t.Host, t.Prefill
}

func firstDecode(hosts []scorer.Host) int {
	for i := range hosts {
		if hosts[i].Role != scorer.RolePrefill {
			return i
		}
	}
	return 0
}
