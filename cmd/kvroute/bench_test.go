package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim/fleet"
	"github.com/kvroute/kvroute/internal/sim/report"
)

const sharedTrace = "../../../shared/traces/mooncake_synthetic.jsonl"

// The bench contract (docs/simulator.md): these keys, these types. Other tools read
// the file, so a missing or renamed key is a breaking change.
func validateBenchJSON(t *testing.T, raw []byte, wantStrategies []string, wantReplicas int) {
	t.Helper()
	var doc map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("bench output is not JSON: %v", err)
	}
	num := func(where string, v any) float64 {
		n, ok := v.(json.Number)
		if !ok {
			t.Fatalf("%s: want a number, got %T (%v)", where, v, v)
		}
		f, err := n.Float64()
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
			t.Fatalf("%s: %v is not a finite non-negative number", where, n)
		}
		return f
	}
	obj := func(where string, v any, keys ...string) map[string]any {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("%s: want an object, got %T", where, v)
		}
		for _, k := range keys {
			if _, ok := m[k]; !ok {
				t.Fatalf("%s: missing key %q", where, k)
			}
		}
		return m
	}
	obj("top level", doc, "trace", "replicas", "results", "ceiling_hit_ratio")
	if s, ok := doc["trace"].(string); !ok || s == "" {
		t.Fatalf("trace: want the trace path, got %v", doc["trace"])
	}
	if r := num("replicas", doc["replicas"]); r != float64(wantReplicas) {
		t.Fatalf("replicas = %v, want %d", r, wantReplicas)
	}
	if c := num("ceiling_hit_ratio", doc["ceiling_hit_ratio"]); c <= 0 || c > 1 {
		t.Fatalf("ceiling_hit_ratio = %v, want in (0, 1]", c)
	}
	results, ok := doc["results"].([]any)
	if !ok || len(results) != len(wantStrategies) {
		t.Fatalf("results: want %d entries, got %v", len(wantStrategies), doc["results"])
	}
	for i, r := range results {
		m := obj("results[i]", r, "strategy", "requests", "ttft_ms", "tpot_ms", "e2e_ms",
			"output_tok_per_s", "cache_hit_ratio", "load_imbalance", "router_us")
		if m["strategy"] != wantStrategies[i] {
			t.Fatalf("results[%d].strategy = %v, want %s", i, m["strategy"], wantStrategies[i])
		}
		if num("requests", m["requests"]) < 1 {
			t.Fatal("requests must be positive")
		}
		pct := func(key string, ps ...string) map[string]float64 {
			o := obj(key, m[key], ps...)
			out := map[string]float64{}
			for _, p := range ps {
				out[p] = num(key+"."+p, o[p])
			}
			return out
		}
		ttft := pct("ttft_ms", "p50", "p90", "p99")
		if !(ttft["p50"] <= ttft["p90"] && ttft["p90"] <= ttft["p99"]) || ttft["p50"] == 0 {
			t.Fatalf("%s: ttft percentiles %v not increasing", wantStrategies[i], ttft)
		}
		pct("tpot_ms", "p50", "p90")
		e2e := pct("e2e_ms", "p50", "p99")
		if e2e["p50"] < ttft["p50"] {
			t.Fatalf("%s: e2e p50 %v below ttft p50 %v", wantStrategies[i], e2e["p50"], ttft["p50"])
		}
		pct("router_us", "p50", "p99")
		if h := num("cache_hit_ratio", m["cache_hit_ratio"]); h > 1 {
			t.Fatalf("cache_hit_ratio %v > 1", h)
		}
		if li := num("load_imbalance", m["load_imbalance"]); li < 1 || li > float64(wantReplicas) {
			t.Fatalf("load_imbalance %v outside [1, replicas]", li)
		}
		if num("output_tok_per_s", m["output_tok_per_s"]) <= 0 {
			t.Fatal("output_tok_per_s must be positive")
		}
	}
}

func TestBenchWritesTheContract(t *testing.T) {
	if _, err := os.Stat(sharedTrace); err != nil {
		t.Skipf("shared trace not present: %v", err)
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "res.json")
	var stdout, stderr bytes.Buffer
	err := runBench(benchOptions{
		trace: sharedTrace, replicas: 4, strategies: strings.Join(fleet.StrategyNames, ","),
		out: out, rateScale: 1, seed: 7, profile: "llama3-8b-h100", limit: 250,
	}, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	validateBenchJSON(t, raw, fleet.StrategyNames, 4)
	// The simulator sees each router's books: every strategy reports its
	// prediction error, and kvroute's own profile predicts better than a
	// router that predicts nothing (an error of 100%).
	var rep report.Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.PredictionError == nil || *r.PredictionError < 0 {
			t.Fatalf("%s: prediction_error = %v", r.Strategy, r.PredictionError)
		}
		if r.Strategy == "kv_cache_aware" && *r.PredictionError >= 1 {
			t.Errorf("kv_cache_aware: prediction_error = %v, want below 1", *r.PredictionError)
		}
	}

	f, err := os.Open(filepath.Join(dir, "res.png"))
	if err != nil {
		t.Fatalf("no plot next to the JSON: %v", err)
	}
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	if err != nil || cfg.Width < 400 || cfg.Height < 200 {
		t.Fatalf("plot is not a sensible PNG: %v %+v", err, cfg)
	}
	table := stdout.String()
	for _, s := range fleet.StrategyNames {
		if !strings.Contains(table, "| "+s+" |") {
			t.Fatalf("markdown table lacks a row for %s:\n%s", s, table)
		}
	}
	if stderr.Len() != 0 {
		t.Fatalf("stderr is not a terminal, yet got output: %q", stderr.String())
	}
}

func TestBenchRejectsBadFlags(t *testing.T) {
	cases := map[string]benchOptions{
		"give --trace FILE":       {replicas: 8, strategies: "round_robin", rateScale: 1},
		"--replicas":              {trace: "x", replicas: 0, strategies: "round_robin", rateScale: 1},
		"--rate-scale":            {trace: "x", replicas: 2, strategies: "round_robin", rateScale: -1},
		"unknown strategy":        {trace: "x", replicas: 2, strategies: "round_robin,fastest", rateScale: 1},
		"unknown engine profile":  {trace: "x", replicas: 2, strategies: "round_robin", rateScale: 1, profile: "tpu"},
		"open trace":              {trace: filepath.Join(t.TempDir(), "missing.jsonl"), replicas: 2, strategies: "round_robin", rateScale: 1},
		"--cache-state":           {trace: "x", replicas: 2, strategies: "round_robin", rateScale: 1, cacheState: "exact"},
		"--spread":                {trace: "x", replicas: 2, strategies: "round_robin", rateScale: 1, spread: "sticky"},
		"--gateways":              {trace: "x", replicas: 2, strategies: "round_robin", rateScale: 1, top: fleet.Topology{Gateways: 1000}},
		"--max-loras":             {trace: "x", replicas: 2, strategies: "round_robin", rateScale: 1, adapters: 4, maxLoRAs: 0},
		"\"a100x\"":               {trace: "x", replicas: 2, strategies: "round_robin", rateScale: 1, profile: "llama3-8b-h100,a100x"},
		"--dp-ranks":              {trace: "x", replicas: 2, strategies: "round_robin", rateScale: 1, dpRanks: 65},
		"--index-capacity-scale":  {trace: "x", replicas: 2, strategies: "round_robin", rateScale: 1, capScale: 8},
		"--dp-routing \"engine\"": {trace: "x", replicas: 2, strategies: "round_robin", rateScale: 1, dpRanks: 2, dpRouting: "engine"},
		"one gateway and one worker": {trace: "x", replicas: 2, strategies: "round_robin", rateScale: 1, dpRanks: 2, dpRouting: "endpoint",
			top: fleet.Topology{Gateways: 2}},
	}
	for want, o := range cases {
		var out, errb bytes.Buffer
		err := runBench(o, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: error %v, want it to mention %q", o, err, want)
		}
	}
}

func TestBenchGeneratedWorkload(t *testing.T) {
	out := filepath.Join(t.TempDir(), "wl.json")
	var stdout bytes.Buffer
	err := runBench(benchOptions{workload: "shared-prefix", replicas: 4, strategies: "round_robin,kv_cache_aware",
		out: out, rateScale: 1, seed: 3, limit: 600}, &stdout, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(out)
	validateBenchJSON(t, raw, []string{"round_robin", "kv_cache_aware"}, 4)
	if !strings.Contains(string(raw), `"trace": "workload:shared-prefix"`) {
		t.Fatalf("trace field does not name the workload:\n%s", raw[:200])
	}
}

// --dp-ranks: every replica serves that many data-parallel ranks, each an
// engine; routed per rank (kvroute's way) the fleet hits more of its
// prefixes than routed per endpoint with the engines balancing their ranks.
func TestBenchDataParallelRanks(t *testing.T) {
	hit := map[string]float64{}
	for _, mode := range []string{"rank", "endpoint"} {
		out := filepath.Join(t.TempDir(), mode+".json")
		var stdout bytes.Buffer
		err := runBench(benchOptions{workload: "shared-prefix", replicas: 2, strategies: "kv_cache_aware",
			out: out, rateScale: 1, seed: 3, limit: 400, dpRanks: 2, dpRouting: mode}, &stdout, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := os.ReadFile(out)
		validateBenchJSON(t, raw, []string{"kv_cache_aware"}, 4)
		var rep report.Report
		if err := json.Unmarshal(raw, &rep); err != nil {
			t.Fatal(err)
		}
		hit[mode] = rep.Results[0].CacheHitRatio
		if !strings.Contains(stdout.String(), "2 data-parallel ranks per replica routed per "+mode) {
			t.Errorf("the table's header does not say the ranks:\n%s", stdout.String())
		}
	}
	if hit["rank"] <= hit["endpoint"] {
		t.Errorf("hit ratio per rank %.3f, per endpoint %.3f: want per rank ahead", hit["rank"], hit["endpoint"])
	}
}

// --cache-state precise runs the same strategies with the engines' KV
// events bridged into the index, and says so in the results.
func TestBenchPreciseCacheState(t *testing.T) {
	out := filepath.Join(t.TempDir(), "precise.json")
	var stdout bytes.Buffer
	err := runBench(benchOptions{workload: "shared-prefix", replicas: 4, strategies: "kv_cache_aware",
		out: out, rateScale: 1, seed: 3, limit: 400, cacheState: "precise"}, &stdout, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(out)
	validateBenchJSON(t, raw, []string{"kv_cache_aware"}, 4)
	var rep report.Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.CacheState != "precise" || rep.Results[0].PredictionError == nil {
		t.Fatalf("cache_state %q, prediction_error %v", rep.CacheState, rep.Results[0].PredictionError)
	}
	if !strings.Contains(stdout.String(), "precise cache state") {
		t.Errorf("the table's header does not say the cache state:\n%s", stdout.String())
	}
}

// bench runs the production shape: every strategy at 2 gateways x 3
// workers, the topology in the results file.
func TestBenchAtTopology(t *testing.T) {
	out := filepath.Join(t.TempDir(), "topo.json")
	var stdout bytes.Buffer
	o := benchOptions{workload: "shared-prefix", replicas: 4, strategies: "round_robin,kv_cache_aware,dynamo_kv",
		out: out, rateScale: 1, seed: 3, limit: 400, reports: true, top: fleet.Topology{Gateways: 2, Workers: 3}}
	if err := runBench(o, &stdout, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(out)
	validateBenchJSON(t, raw, []string{"round_robin", "kv_cache_aware", "dynamo_kv"}, 4)
	if !strings.Contains(string(raw), `"gateways": 2`) || !strings.Contains(string(raw), `"workers": 3`) {
		t.Fatalf("results file does not name the topology:\n%s", raw[:300])
	}
	if !strings.Contains(stdout.String(), "2 gateways x 3 workers") {
		t.Fatalf("summary does not name the topology:\n%s", stdout.String())
	}
}

// --adapters and a mixed --profile run, and the output says what the fleet
// is.
func TestBenchAdaptersOnMixedFleet(t *testing.T) {
	out := filepath.Join(t.TempDir(), "lora.json")
	var stdout bytes.Buffer
	err := runBench(benchOptions{workload: "multi-turn", replicas: 4, strategies: "kv_cache_aware",
		out: out, rateScale: 1, seed: 3, limit: 300, profile: "llama3-8b-h100,llama3-8b-a100",
		adapters: 8, maxLoRAs: 2, loraLoad: 20 * time.Millisecond}, &stdout, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if s := stdout.String(); !strings.Contains(s, "4 x llama3-8b-h100,llama3-8b-a100") || !strings.Contains(s, "8 LoRA adapters (2 per batch, 20ms to load)") {
		t.Errorf("header does not describe the fleet:\n%s", s)
	}
	raw, _ := os.ReadFile(out)
	validateBenchJSON(t, raw, []string{"kv_cache_aware"}, 4)
}
