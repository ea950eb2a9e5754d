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
	"fmt"
	"time"

	"github.com/kvroute/kvroute/dispatch"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/workload"
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

// RunPD replays w through a disaggregating router on a fresh fleet. A KV
// transfer's end is a timed event of the shared loop.
func RunPD(cfg PDConfig, w *workload.Workload, rt PDRouter) (*PDResult, error) {
	if len(cfg.Roles) != cfg.Replicas {
		return nil, fmt.Errorf("%d roles for %d replicas", len(cfg.Roles), cfg.Replicas)
	}
	if cfg.KVTransferBandwidth <= 0 {
		cfg.KVTransferBandwidth = 50e9
	}
	firstObs, _ := rt.(FirstTokenObserver)
	doneObs, _ := rt.(DoneObserver)
	stateObs, _ := rt.(StateObserver)
	l, err := newLoop(cfg.Config, w, stateObs)
	if err != nil {
		return nil, err
	}
	n := len(w.Requests)
	res := &PDResult{Result: l.res, Prefill: make([]int, n)}
	prefillReqs := make([]sim.Request, n)
	decodeReqs := make([]sim.Request, n)
	chains := make([][]uint64, n)
	inPrefill := make([]bool, n)
	bs := cfg.Profile.BlockSize
	kvBytes := cfg.Profile.KVBytesPerToken()

	end := func(idx, k int, er *sim.Request, now time.Duration, rejected bool) {
		rec := &res.Records[idx]
		l.finished(now)
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
		*er = engineRequest(idx, wr, chains[idx], wr.OutputTokens, now)
		er.KVTransferred = transferred
		if err := l.add(k, er, idx, now); err != nil {
			end(idx, k, er, now, true)
		}
	}
	l.arrive = func(idx int, now time.Duration) error {
		wr := &w.Requests[idx]
		prompt := wr.Text()
		t0 := time.Now()
		k, p := rt.RoutePD(wr, prompt, now)
		took := time.Since(t0)
		if k < 0 || k >= cfg.Replicas || p >= cfg.Replicas {
			return fmt.Errorf("router sent request %d to decode %d, prefill %d of %d replicas", idx, k, p, cfg.Replicas)
		}
		chains[idx] = sim.BlockChain(prompt, bs)
		rec := &res.Records[idx]
		rec.Replica, rec.PromptTokens, rec.OutputTokens, rec.Arrival, rec.RouterTime = k, wr.PromptTokens, wr.OutputTokens, now, took
		res.Prefill[idx] = -1
		if p >= 0 {
			er := &prefillReqs[idx]
			*er = engineRequest(idx, wr, chains[idx], 1, now)
			if err := l.add(p, er, idx, now); err == nil {
				res.Prefill[idx] = p
				res.Disaggregated++
				inPrefill[idx] = true
			}
		}
		if res.Prefill[idx] < 0 {
			// Not split, or the prefill replica refused it: decode-only,
			// as kvroute.pd falls back.
			toDecode(idx, now, false)
		}
		return nil
	}
	l.token = func(_ int, er *sim.Request, idx int, now time.Duration) {
		if firstObs != nil && er != &prefillReqs[idx] {
			firstObs.FirstToken(&w.Requests[idx], res.Records[idx].Replica, now)
		}
	}
	l.finish = func(_ int, er *sim.Request, idx int, now time.Duration) error {
		if inPrefill[idx] && er == &prefillReqs[idx] {
			inPrefill[idx] = false
			res.Records[idx].CachedTokens = er.CachedTokens
			res.Records[idx].Preemptions = er.Preemptions
			// The decode engine pulls only the blocks its own prefix
			// cache lacks (vLLM's connector matches locally first).
			pull := max(er.PromptTokens-l.reps[res.Records[idx].Replica].eng.PeekCached(chains[idx]), 0)
			d := cfg.KVTransferLatency + time.Duration(float64(pull)*kvBytes/cfg.KVTransferBandwidth*float64(time.Second))
			res.Transfer += d
			l.at(now+d, func(at time.Duration) error {
				toDecode(idx, at, true)
				return nil
			})
			return nil
		}
		end(idx, res.Records[idx].Replica, er, now, false)
		return nil
	}
	if _, err := l.run(); err != nil {
		return nil, err
	}
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
		a.tickets = map[int]*dispatch.Ticket{}
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
