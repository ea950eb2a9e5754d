package fleet

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/workload"
)

// overloadMix is interactive chat (short prompts, short answers, Poisson
// arrivals at chatRate) mixed with 10k-token batch jobs at batchRate, for
// dur of virtual time: batch jobs alone ask for more prefill than the fleet
// has. Batch requests carry model "batch" so a per-model default classes
// them.
func overloadMix(dur time.Duration, chatRate, batchRate float64, seed uint64) *workload.Workload {
	rng := rand.New(rand.NewPCG(seed, 10))
	w := &workload.Workload{}
	add := func(rate float64, model string, prompt, output int) {
		var t float64
		for {
			t += rng.ExpFloat64() / rate
			at := time.Duration(t * float64(time.Second))
			if at >= dur {
				return
			}
			text := workload.PseudoTokens(rng.Uint64(), prompt)
			w.Requests = append(w.Requests, workload.Request{
				Arrival: at, Model: model, Prompt: text, PromptTokens: sim.CountTokens(text), OutputTokens: output,
			})
		}
	}
	add(chatRate, "chat", 600, 120)
	add(batchRate, "batch", 10_000, 200)
	sortRequests(w)
	return w
}

func sortRequests(w *workload.Workload) {
	rs := w.Requests
	for i := 1; i < len(rs); i++ {
		for j := i; j > 0 && rs[j].Arrival < rs[j-1].Arrival; j-- {
			rs[j], rs[j-1] = rs[j-1], rs[j]
		}
	}
	for i := range rs {
		rs[i].ID = i
	}
}

func mixAdmission() admission.Config {
	c := admission.Defaults()
	c.Enabled = true
	c.ModelClasses = map[string]admission.Class{"batch": admission.Batch, "chat": admission.Interactive}
	c.MaxHeld = 100_000
	c.DeadlineMs = [3]int{admission.MaxDeadlineMs, admission.MaxDeadlineMs, admission.MaxDeadlineMs}
	return c
}

func classOf(cfg admission.Config) func(*workload.Request) admission.Class {
	return func(r *workload.Request) admission.Class {
		c, _ := cfg.Classify("", "/v1/completions", r.Model)
		return c
	}
}

type mixRow struct {
	name            string
	chat, batch     Percentiles
	tokPerS         float64
	served, refused int
	held            uint64
}

func TestAdmissionProtectsInteractiveUnderBatchOverload(t *testing.T) {
	p, _ := sim.LookupProfile("")
	const replicas = 4
	w := overloadMix(40*time.Second, 10, 14, 1)
	fleetCfg := Config{Replicas: replicas, Profile: p}
	isChat := func(c admission.Class) bool { return c == admission.Interactive }
	isBatch := func(c admission.Class) bool { return c == admission.Batch }
	cfg := mixAdmission()
	classes := make([]admission.Class, len(w.Requests))
	for i := range w.Requests {
		classes[i] = classOf(cfg)(&w.Requests[i])
	}

	newRouter := func() *RealRouter {
		r, err := NewStrategy("kv_cache_aware", replicas, StrategyOptions{Seed: 1, Profile: p})
		if err != nil {
			t.Fatal(err)
		}
		return r.(*RealRouter)
	}
	fifo, err := Run(fleetCfg, w, newRouter())
	if err != nil {
		t.Fatal(err)
	}
	adm, err := RunAdmitted(fleetCfg, w, newRouter(), AdmissionOptions{Config: cfg, Class: classOf(cfg)})
	if err != nil {
		t.Fatal(err)
	}
	// The same holding with one class for everything: FIFO in the proxy.
	one, err := RunAdmitted(fleetCfg, w, newRouter(), AdmissionOptions{Config: cfg, Class: func(*workload.Request) admission.Class { return admission.Standard }})
	if err != nil {
		t.Fatal(err)
	}
	// Per-worker queues (8 Envoy workers) instead of one global queue.
	perWorker, err := RunAdmitted(fleetCfg, w, newRouter(), AdmissionOptions{Config: cfg, Class: classOf(cfg), Workers: 8})
	if err != nil {
		t.Fatal(err)
	}
	rows := []mixRow{
		{name: "FIFO (no admission)", chat: ClassTTFT(fifo, classes, isChat), batch: ClassTTFT(fifo, classes, isBatch), tokPerS: fifo.Summarize().OutputTokPerS, served: len(w.Requests) - fifo.Summarize().Rejected},
		{name: "admission", chat: ClassTTFT(adm.Result, classes, isChat), batch: ClassTTFT(adm.Result, classes, isBatch), tokPerS: adm.Summarize().OutputTokPerS, served: len(w.Requests) - adm.Summarize().Rejected, held: adm.Stats.Held},
		{name: "admission, 8 worker queues", chat: ClassTTFT(perWorker.Result, classes, isChat), batch: ClassTTFT(perWorker.Result, classes, isBatch), tokPerS: perWorker.Summarize().OutputTokPerS, served: len(w.Requests) - perWorker.Summarize().Rejected, held: perWorker.Stats.Held},
		{name: "holding, one class", chat: ClassTTFT(one.Result, classes, isChat), batch: ClassTTFT(one.Result, classes, isBatch), tokPerS: one.Summarize().OutputTokPerS, served: len(w.Requests) - one.Summarize().Rejected, held: one.Stats.Held},
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d requests (%d interactive), %d replicas %s\n", len(w.Requests), countClass(classes, admission.Interactive), replicas, p.Name)
	fmt.Fprintf(&b, "| run | interactive TTFT p50 | p99 | batch TTFT p50 | p99 | output tok/s | served | held |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %v | %v | %v | %v | %.0f | %d | %d |\n", r.name, r.chat.P50.Round(time.Millisecond), r.chat.P99.Round(time.Millisecond),
			r.batch.P50.Round(time.Millisecond), r.batch.P99.Round(time.Millisecond), r.tokPerS, r.served, r.held)
	}
	t.Log("\n" + b.String())
	t.Logf("admission stats %+v, simulated in %v + %v", adm.Stats, fifo.Wall, adm.Wall)
	if adm.Stats.Held == 0 {
		t.Fatal("the mix never saturated the fleet: nothing was held, the test measures nothing")
	}
	if rows[1].refused = len(w.Requests) - rows[1].served; rows[1].refused != 0 {
		t.Fatalf("admission refused %d requests with deadlines of an hour", rows[1].refused)
	}
	if 5*rows[1].chat.P99 > rows[0].chat.P99 {
		t.Fatalf("interactive TTFT p99 %v with admission, %v FIFO: want at most a fifth", rows[1].chat.P99, rows[0].chat.P99)
	}
	if d := rows[1].tokPerS/rows[0].tokPerS - 1; d < -0.10 || d > 0.10 {
		t.Fatalf("throughput %.0f tok/s with admission vs %.0f FIFO: more than 10%% apart", rows[1].tokPerS, rows[0].tokPerS)
	}
	// Holding alone does not do it: the classes do.
	if 2*rows[1].chat.P99 > rows[3].chat.P99 {
		t.Errorf("interactive TTFT p99 %v with classes, %v holding with one class: classes should at least halve it", rows[1].chat.P99, rows[3].chat.P99)
	}
	// Per-worker queues keep the protection (the cost is in docs/admission.md).
	if 5*rows[2].chat.P99 > rows[0].chat.P99 {
		t.Errorf("8 worker queues: interactive TTFT p99 %v, FIFO %v", rows[2].chat.P99, rows[0].chat.P99)
	}
}

func countClass(cs []admission.Class, c admission.Class) (n int) {
	for _, x := range cs {
		if x == c {
			n++
		}
	}
	return n
}

// Refusals in the simulation are the controller's: every expired, shed and
// overflowed request is a refused record, every other request is served,
// and nothing is held at the end.
func TestRunAdmittedRefusalsMatchTheController(t *testing.T) {
	p, _ := sim.LookupProfile("")
	w := overloadMix(10*time.Second, 10, 14, 2)
	cfg := mixAdmission()
	cfg.MaxHeld = 20
	cfg.DeadlineMs = [3]int{1_000, 5_000, 2_000}
	r, err := NewStrategy("kv_cache_aware", 2, StrategyOptions{Seed: 1, Profile: p})
	if err != nil {
		t.Fatal(err)
	}
	res, err := RunAdmitted(Config{Replicas: 2, Profile: p}, w, r.(*RealRouter), AdmissionOptions{Config: cfg, Class: classOf(cfg)})
	if err != nil {
		t.Fatal(err)
	}
	st := res.Stats
	refused := 0
	for i, rec := range res.Records {
		if res.Refused[i] {
			refused++
			if rec.Replica != -1 {
				t.Fatalf("refused request %d ran on replica %d", i, rec.Replica)
			}
		}
	}
	t.Logf("%d requests: %+v", len(w.Requests), st)
	if st.Expired == 0 || st.Overflow+st.Shed == 0 {
		t.Fatalf("the test needs expiries and overflow: %+v", st)
	}
	if uint64(refused) != st.Expired+st.Shed+st.Overflow {
		t.Fatalf("%d refused records, controller counts %+v", refused, st)
	}
	if st.Held != st.Released+st.Expired+st.Shed {
		t.Fatalf("held %d != released %d + expired %d + shed %d: something is still held", st.Held, st.Released, st.Expired, st.Shed)
	}
	if st.Admitted+st.Held+st.Overflow != uint64(len(w.Requests)) {
		t.Fatalf("counts do not add up to %d requests: %+v", len(w.Requests), st)
	}
}
