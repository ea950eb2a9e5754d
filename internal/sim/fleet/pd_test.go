package fleet

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/report"
	"github.com/kvroute/kvroute/internal/sim/workload"
	"github.com/kvroute/kvroute/scorer"
)

// fixedPD sends every request to decode replica d and prefill replica p.
type fixedPD struct{ d, p int }

func (f fixedPD) RoutePD(*workload.Request, string, time.Duration) (int, int) { return f.d, f.p }

func pdProfile(t *testing.T) sim.Profile {
	t.Helper()
	p, err := sim.LookupProfile("")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// One split request on an idle fleet: TTFT is exactly the prefill replica's
// cold prefill, the KV transfer, and one decode step that recomputes the
// last prompt token.
func TestRunPDTimeline(t *testing.T) {
	prof := pdProfile(t)
	const n, out = 4096, 8
	w := &workload.Workload{Requests: []workload.Request{{ID: 0, Model: "m", Prompt: workload.PseudoTokens(1, n), PromptTokens: n, OutputTokens: out}}}
	cfg := PDConfig{Config: Config{Replicas: 2, Profile: prof}, Roles: []scorer.Role{scorer.RolePrefill, scorer.RoleDecode},
		KVTransferBandwidth: 25e9, KVTransferLatency: 2 * time.Millisecond}
	res, err := RunPD(cfg, w, fixedPD{d: 1, p: 0})
	if err != nil {
		t.Fatal(err)
	}
	transfer := 2*time.Millisecond + time.Duration(float64(n)*prof.KVBytesPerToken()/25e9*float64(time.Second))
	want := prof.PrefillTime(0, n) + transfer + prof.StepTime([]sim.SeqWork{{Context: n - 1, NewTokens: 1}})
	rec := res.Records[0]
	if rec.TTFT != want {
		t.Errorf("TTFT %v, want prefill %v + transfer %v + one decode step = %v", rec.TTFT, prof.PrefillTime(0, n), transfer, want)
	}
	if res.Disaggregated != 1 || res.Prefill[0] != 0 || rec.Replica != 1 || res.Transfer != transfer {
		t.Errorf("disaggregated %d prefill %d decode %d transfer %v", res.Disaggregated, res.Prefill[0], rec.Replica, res.Transfer)
	}
	if rec.E2E <= rec.TTFT || rec.TPOT <= 0 {
		t.Errorf("E2E %v TPOT %v", rec.E2E, rec.TPOT)
	}
	// Decode-only (prefill -1) on the same fleet: the decode replica
	// prefills, no transfer.
	res, err = RunPD(cfg, w, fixedPD{d: 1, p: -1})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Records[0].TTFT; got != prof.PrefillTime(0, n) {
		t.Errorf("decode-only TTFT %v, want the cold prefill %v", got, prof.PrefillTime(0, n))
	}
	if res.Disaggregated != 0 || res.Transfer != 0 {
		t.Errorf("decode-only run split %d requests", res.Disaggregated)
	}
}

// The real router on a 1 prefill + 2 decode fleet: long uncached prompts
// are split, short ones are not, prefill only ever lands on the prefill
// replica and decode never does.
func TestRunPDRealRouterThreshold(t *testing.T) {
	prof := pdProfile(t)
	var reqs []workload.Request
	for i := 0; i < 40; i++ {
		tokens := 100
		if i%2 == 1 {
			tokens = 2000
		}
		reqs = append(reqs, workload.Request{ID: i, Model: "m", Prompt: workload.PseudoTokens(uint64(i+10), tokens),
			PromptTokens: tokens, OutputTokens: 16, Arrival: time.Duration(i) * 50 * time.Millisecond})
	}
	w := &workload.Workload{Requests: reqs}
	roles := []scorer.Role{scorer.RolePrefill, scorer.RoleDecode, scorer.RoleDecode}
	cfgJSON := []byte(`{"strategy":"kv_cache_aware","disaggregation":{"prefillStrategy":"kv_cache_aware","threshold":512}}`)
	rt, err := NewPDStrategy("kv_cache_aware", roles, StrategyOptions{Seed: 1, Profile: prof, Config: cfgJSON})
	if err != nil {
		t.Fatal(err)
	}
	res, err := RunPD(PDConfig{Config: Config{Replicas: 3, Profile: prof}, Roles: roles}, w, rt)
	if err != nil {
		t.Fatal(err)
	}
	for i, rec := range res.Records {
		long := reqs[i].PromptTokens >= 512
		if rec.Rejected {
			t.Fatalf("request %d rejected", i)
		}
		if rec.Replica == 0 {
			t.Errorf("request %d decoded on the prefill replica", i)
		}
		if long && res.Prefill[i] != 0 {
			t.Errorf("request %d (%d uncached tokens) not prefilled remotely (prefill %d)", i, reqs[i].PromptTokens, res.Prefill[i])
		}
		if !long && res.Prefill[i] != -1 {
			t.Errorf("request %d (%d tokens, below the threshold) was split", i, reqs[i].PromptTokens)
		}
	}
	if res.Disaggregated != 20 || rt.Split != 20 {
		t.Errorf("split %d (router says %d), want 20", res.Disaggregated, rt.Split)
	}
	// Above the threshold: the same fleet never splits.
	hi := []byte(`{"strategy":"kv_cache_aware","disaggregation":{"prefillStrategy":"kv_cache_aware","threshold":100000}}`)
	rt2, err := NewPDStrategy("kv_cache_aware", roles, StrategyOptions{Seed: 1, Profile: prof, Config: hi})
	if err != nil {
		t.Fatal(err)
	}
	res2, err := RunPD(PDConfig{Config: Config{Replicas: 3, Profile: prof}, Roles: roles}, w, rt2)
	if err != nil {
		t.Fatal(err)
	}
	if res2.Disaggregated != 0 {
		t.Errorf("threshold 100000 split %d requests", res2.Disaggregated)
	}
}

// RunPD with a router that never splits, on an all-"both" fleet, is Run:
// the same records request by request.
func TestRunPDWithoutSplitsMatchesRun(t *testing.T) {
	prof := pdProfile(t)
	w, err := workload.SharedPrefix{Groups: 4, PromptsPerGroup: 25, SystemTokens: 1500, QuestionTokens: 200, OutputTokens: 20, Rate: 40, Seed: 3}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	roles := make([]scorer.Role, 3)
	agg, err := NewStrategy("kv_cache_aware", 3, StrategyOptions{Seed: 7, Profile: prof})
	if err != nil {
		t.Fatal(err)
	}
	want, err := Run(Config{Replicas: 3, Profile: prof}, w, agg)
	if err != nil {
		t.Fatal(err)
	}
	pd, err := NewPDStrategy("kv_cache_aware", roles, StrategyOptions{Seed: 7, Profile: prof})
	if err != nil {
		t.Fatal(err)
	}
	got, err := RunPD(PDConfig{Config: Config{Replicas: 3, Profile: prof}, Roles: roles}, w, pd)
	if err != nil {
		t.Fatal(err)
	}
	if got.Disaggregated != 0 {
		t.Fatalf("split %d requests without a disaggregation config", got.Disaggregated)
	}
	for i := range want.Records {
		a, b := want.Records[i], got.Records[i]
		a.RouterTime, b.RouterTime = 0, 0
		if a != b {
			t.Fatalf("request %d: Run %+v, RunPD %+v", i, a, b)
		}
	}
	if want.Makespan != got.Makespan {
		t.Errorf("makespan %v vs %v", want.Makespan, got.Makespan)
	}
}

// TestPDBenchMooncake is the aggregated-versus-disaggregated comparison on
// a Mooncake trace (minutes of CPU): KVROUTE_PD_BENCH=1 (make bench-pd).
func TestPDBenchMooncake(t *testing.T) {
	if os.Getenv("KVROUTE_PD_BENCH") == "" {
		t.Skip("the full-trace P/D bench runs with KVROUTE_PD_BENCH=1 (make bench-pd)")
	}
	trace := os.Getenv("KVROUTE_PD_TRACE")
	if trace == "" {
		t.Fatal("KVROUTE_PD_TRACE names no trace: run make bench-pd TRACE=FILE.jsonl (a Mooncake JSONL trace)")
	}
	rate := 1.0
	if v := os.Getenv("KVROUTE_PD_RATE"); v != "" {
		if _, err := fmt.Sscan(v, &rate); err != nil || rate <= 0 {
			t.Fatalf("KVROUTE_PD_RATE=%q: want a positive number", v)
		}
	}
	limit := 0
	if v := os.Getenv("KVROUTE_PD_LIMIT"); v != "" {
		if _, err := fmt.Sscan(v, &limit); err != nil || limit < 0 {
			t.Fatalf("KVROUTE_PD_LIMIT=%q: want a request count", v)
		}
	}
	w, err := workload.LoadMooncake(trace, workload.TraceOptions{RateScale: rate, Limit: limit})
	if err != nil {
		t.Fatal(err)
	}
	prof := pdProfile(t)
	const replicas = 8
	type row struct {
		name string
		s    Summary
		pd   *PDResult
		ttft []time.Duration
	}
	var rows []row
	agg, err := NewStrategy("kv_cache_aware", replicas, StrategyOptions{Seed: 1, Profile: prof})
	if err != nil {
		t.Fatal(err)
	}
	ar, err := Run(Config{Replicas: replicas, Profile: prof}, w, agg)
	if err != nil {
		t.Fatal(err)
	}
	rows = append(rows, row{name: "aggregated 8 x both", s: ar.Summarize(), ttft: ttftSamples(ar)})
	for _, split := range []struct{ p, threshold int }{{2, 512}, {4, 512}, {5, 512}, {6, 512}, {4, 4096}} {
		roles := make([]scorer.Role, replicas)
		for i := range roles {
			roles[i] = scorer.RoleDecode
			if i < split.p {
				roles[i] = scorer.RolePrefill
			}
		}
		cfg := []byte(fmt.Sprintf(`{"strategy":"kv_cache_aware","disaggregation":{"prefillStrategy":"kv_cache_aware","threshold":%d}}`, split.threshold))
		rt, err := NewPDStrategy("kv_cache_aware", roles, StrategyOptions{Seed: 1, Profile: prof, Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		res, err := RunPD(PDConfig{Config: Config{Replicas: replicas, Profile: prof}, Roles: roles}, w, rt)
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, row{name: fmt.Sprintf("disaggregated %dP + %dD, threshold %d", split.p, replicas-split.p, split.threshold), s: res.Summarize(), pd: res, ttft: ttftSamples(res.Result)})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d requests, rate scale %g, %s, seed 1, kv_cache_aware on both sides; ceiling hit ratio of the 8-replica fleet %.3f\n\n",
		len(w.Requests), rate, prof.Name, Ceiling(w, prof, replicas))
	b.WriteString("| fleet (8 replicas) | split | TTFT p50 | TTFT p90 | TTFT p99 | TPOT p50 | TPOT p90 | E2E p50 | E2E p99 | out tok/s | hit ratio |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }
	for _, r := range rows {
		split := "-"
		if r.pd != nil {
			split = fmt.Sprintf("%.0f%%", 100*float64(r.pd.Disaggregated)/float64(len(w.Requests)))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %.0f | %.3f |\n", r.name, split,
			ms(r.s.TTFT.P50), ms(r.s.TTFT.P90), ms(r.s.TTFT.P99), ms(r.s.TPOT.P50), ms(r.s.TPOT.P90),
			ms(r.s.E2E.P50), ms(r.s.E2E.P99), r.s.OutputTokPerS, r.s.HitRatio)
	}
	t.Log("\n" + b.String())
	if out := os.Getenv("KVROUTE_PD_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		// The same figures in the bench contract's JSON (strategy names say
		// the fleet), and the TTFT CDF next to them.
		rep := &report.Report{Trace: trace, Replicas: replicas, CeilingHitRatio: Ceiling(w, prof, replicas),
			Profile: prof.Name, RateScale: rate, Seed: 1, Mode: "simulated"}
		for _, r := range rows {
			name := "kv_cache_aware"
			if r.pd != nil {
				name = "kv_cache_aware/" + strings.NewReplacer("disaggregated ", "pd-", " + ", "", ", threshold ", "-t").Replace(r.name)
			}
			res := report.Result{Strategy: name, Requests: r.s.Requests,
				TTFTms:        report.P50P90P99{P50: report.Ms(r.s.TTFT.P50), P90: report.Ms(r.s.TTFT.P90), P99: report.Ms(r.s.TTFT.P99)},
				TPOTms:        report.P50P90{P50: report.Ms(r.s.TPOT.P50), P90: report.Ms(r.s.TPOT.P90)},
				E2Ems:         report.P50P99{P50: report.Ms(r.s.E2E.P50), P99: report.Ms(r.s.E2E.P99)},
				OutputTokPerS: r.s.OutputTokPerS, CacheHitRatio: r.s.HitRatio, LoadImbalance: r.s.LoadImbalance,
				RouterUS:    report.P50P99{P50: report.Us(r.s.RouterTime.P50), P99: report.Us(r.s.RouterTime.P99)},
				TTFTSamples: r.ttft,
			}
			rep.Results = append(rep.Results, res)
		}
		base := strings.TrimSuffix(out, filepath.Ext(out))
		if err := rep.WriteJSON(base + ".json"); err != nil {
			t.Fatal(err)
		}
		if err := rep.WritePNG(base + ".png"); err != nil {
			t.Fatal(err)
		}
	}
}

func ttftSamples(res *Result) []time.Duration {
	var d []time.Duration
	for _, rec := range res.Records {
		if !rec.Rejected {
			d = append(d, rec.TTFT)
		}
	}
	return d
}

// A prompt the decode replica already holds is not transferred again: the
// second identical request moves only the fixed latency.
func TestRunPDTransfersOnlyWhatDecodeLacks(t *testing.T) {
	prof := pdProfile(t)
	const n = 4096
	text := workload.PseudoTokens(5, n)
	w := &workload.Workload{Requests: []workload.Request{
		{ID: 0, Model: "m", Prompt: text, PromptTokens: n, OutputTokens: 4},
		{ID: 1, Model: "m", Prompt: text, PromptTokens: n, OutputTokens: 4, Arrival: 10 * time.Second},
	}}
	cfg := PDConfig{Config: Config{Replicas: 2, Profile: prof}, Roles: []scorer.Role{scorer.RolePrefill, scorer.RoleDecode},
		KVTransferLatency: time.Millisecond}
	res, err := RunPD(cfg, w, fixedPD{d: 1, p: 0})
	if err != nil {
		t.Fatal(err)
	}
	full := time.Duration(float64(n) * prof.KVBytesPerToken() / 50e9 * float64(time.Second))
	if want := 2*time.Millisecond + full; res.Transfer != want {
		t.Errorf("transfer %v, want one full prompt (%v) plus two latencies", res.Transfer, full)
	}
	if res.Records[1].CachedTokens < n-16 {
		t.Errorf("second prefill found %d cached tokens on the prefill replica", res.Records[1].CachedTokens)
	}
}
