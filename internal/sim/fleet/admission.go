package fleet

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/workload"
)

// AdmissionOptions configure RunAdmitted.
type AdmissionOptions struct {
	// Config is the admission configuration, as the filter's "admission"
	// key would give it (Enabled is ignored: RunAdmitted always admits).
	Config admission.Config
	// Class gives each request its class, as the x-kvroute-priority header
	// or a per-path/per-model default would.
	Class func(r *workload.Request) admission.Class
	// Workers is how many Envoy workers hold requests, each with its own
	// queue (default 1: one global queue). Arrivals are spread over them
	// round robin, as Envoy spreads connections; on each tick every worker
	// releases in turn, starting from a different one each tick, against
	// the same shared load counters.
	Workers int
}

// AdmittedResult is a RunAdmitted run. Refused requests (expired, shed,
// overflow) are in Records with Rejected set and Refused true.
type AdmittedResult struct {
	*Result
	Classes []admission.Class
	Refused []bool
	// Wait is each request's time held in the proxy (0 when admitted at once).
	Wait  []time.Duration
	Stats admission.Stats
}

// RunAdmitted replays w through admission in front of rr, the same
// admission.Controller the Envoy filter runs: each arrival is admitted,
// held or refused; held requests are examined on a virtual tick of
// Config.TickMs. The saturation test reads what the filter reads: the
// pushed engine state (waiting queue, KV use, at Config.PushInterval) and
// the router's pending prefill tokens. A record's TTFT and E2E count from
// the arrival at the gateway, time held included.
func RunAdmitted(cfg Config, w *workload.Workload, rr *RealRouter, opt AdmissionOptions) (*AdmittedResult, error) {
	if cfg.Replicas < 1 || cfg.Replicas != len(rr.hosts) {
		return nil, fmt.Errorf("fleet of %d replicas, router over %d hosts", cfg.Replicas, len(rr.hosts))
	}
	if err := opt.Config.Validate(); err != nil {
		return nil, err
	}
	if opt.Class == nil {
		return nil, errors.New("AdmissionOptions.Class is required")
	}
	l, err := newLoop(cfg, w, rr)
	if err != nil {
		return nil, err
	}
	workers := max(opt.Workers, 1)
	ctls := make([]*admission.Controller, workers)
	for i := range ctls {
		ctls[i] = admission.NewController(opt.Config)
	}
	heldAnywhere := func() bool {
		for _, c := range ctls {
			if c.Queue().Len() > 0 {
				return true
			}
		}
		return false
	}
	tickNo := 0
	th := opt.Config.Thresholds
	tick := time.Duration(opt.Config.TickMs) * time.Millisecond

	n := len(w.Requests)
	out := &AdmittedResult{
		Result:  l.res,
		Classes: make([]admission.Class, n), Refused: make([]bool, n), Wait: make([]time.Duration, n),
	}
	res := out.Result
	engReqs := make([]sim.Request, n)
	var loads []index.Load
	var saturation []admission.Load
	// nextTick is when the tick timer set last fires (0: none set yet); a
	// tick that finds nothing held sets no next one.
	nextTick := time.Duration(0)

	saturated := func() bool {
		loads = rr.ix.Loads(loads[:0])
		saturation = saturation[:0]
		for i := range rr.hosts {
			h := &rr.hosts[i]
			l := admission.Load{Waiting: h.Waiting, KVUsage: h.KVUsage}
			if h.Slot >= 0 && h.Slot < len(loads) {
				l.PendingPrefillTokens = int64(loads[h.Slot].PrefillTokens)
			}
			saturation = append(saturation, l)
		}
		return th.AllSaturated(saturation)
	}
	refuse := func(idx int, now time.Duration) {
		rec := &res.Records[idx]
		rec.Rejected, rec.Replica = true, -1
		out.Refused[idx] = true
		out.Wait[idx] = now - w.Requests[idx].Arrival
		l.done++
	}
	dispatch := func(idx int, now time.Duration) error {
		out.Wait[idx] = now - w.Requests[idx].Arrival
		return l.dispatch(rr, rr, engReqs, idx, now, w.Requests[idx].Arrival)
	}
	// onTick releases what every worker can, each tick starting from a
	// different worker, and sets the next tick while anything is held.
	var onTick func(now time.Duration) error
	onTick = func(now time.Duration) error {
		if !heldAnywhere() {
			return nil
		}
		nextTick = now + tick
		l.at(nextTick, onTick)
		var err error
		for k := range workers {
			ctl := ctls[(tickNo+k)%workers]
			expired := ctl.Tick(now.Milliseconds(), saturated, func(it admission.Item) {
				if err == nil {
					err = dispatch(int(it.ID), now)
				}
			})
			if err != nil {
				return err
			}
			for _, it := range expired {
				refuse(int(it.ID), now)
			}
		}
		tickNo++
		return nil
	}
	l.arrive = func(idx int, now time.Duration) error {
		wr := &w.Requests[idx]
		class := opt.Class(wr)
		out.Classes[idx] = class
		res.Records[idx].PromptTokens, res.Records[idx].OutputTokens, res.Records[idx].Arrival = wr.PromptTokens, wr.OutputTokens, now
		deadline, _ := opt.Config.Deadline(class, "", now.Milliseconds())
		v, shed, evicted := ctls[idx%workers].Arrive(uint64(idx), class, deadline, now.Milliseconds(), saturated())
		if evicted {
			refuse(int(shed.ID), now)
		}
		switch v {
		case admission.Admit:
			return dispatch(idx, now)
		case admission.Hold:
			if nextTick <= now {
				nextTick = (now/tick + 1) * tick
				l.at(nextTick, onTick)
			}
		case admission.Refuse:
			refuse(idx, now)
		}
		return nil
	}
	l.token = func(ri int, _ *sim.Request, idx int, now time.Duration) {
		rr.FirstToken(&w.Requests[idx], ri, now)
	}
	l.finish = func(ri int, er *sim.Request, idx int, now time.Duration) error {
		wr := &w.Requests[idx]
		rec := &res.Records[idx]
		rec.CachedTokens = er.CachedTokens
		rec.setTimes(er, wr.Arrival)
		rec.Preemptions = er.Preemptions
		l.finished(now)
		rr.Done(wr, ri, er.CachedTokens, now)
		return nil
	}
	if _, err := l.run(); err != nil {
		return nil, err
	}
	for _, c := range ctls {
		st := c.Stats()
		out.Stats.Admitted += st.Admitted
		out.Stats.Held += st.Held
		out.Stats.Released += st.Released
		out.Stats.Expired += st.Expired
		out.Stats.Shed += st.Shed
		out.Stats.Overflow += st.Overflow
		out.Stats.Cancelled += st.Cancelled
	}
	return out, nil
}

// ClassTTFT is the TTFT percentiles of the served requests whose class
// satisfies keep.
func ClassTTFT(res *Result, classes []admission.Class, keep func(admission.Class) bool) Percentiles {
	var d []time.Duration
	for i, rec := range res.Records {
		if !rec.Rejected && keep(classes[i]) {
			d = append(d, rec.TTFT)
		}
	}
	return percentiles(d)
}
