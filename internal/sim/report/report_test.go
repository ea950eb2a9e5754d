package report

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func sample() *Report {
	return &Report{
		Trace: "t.jsonl", Replicas: 2, CeilingHitRatio: 0.4, Seed: 1,
		Results: []Result{
			{Strategy: "round_robin", Requests: 3, CacheHitRatio: 0.1, LoadImbalance: 1.01,
				TTFTms: P50P90P99{10, 20, 30}, TTFTSamples: []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond}},
			{Strategy: "kv_cache_aware", Requests: 3, CacheHitRatio: 0.35, LoadImbalance: 1.1,
				TTFTms: P50P90P99{1, 2, 3}, TTFTSamples: []time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond}},
		},
	}
}

func TestJSONKeysAreTheContract(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.json")
	if err := sample().WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"trace", "replicas", "ceiling_hit_ratio", "results"} {
		if _, ok := doc[k]; !ok {
			t.Fatalf("missing %s", k)
		}
	}
	r := doc["results"].([]any)[0].(map[string]any)
	for _, k := range []string{"strategy", "requests", "ttft_ms", "tpot_ms", "e2e_ms", "output_tok_per_s", "cache_hit_ratio", "load_imbalance", "router_us"} {
		if _, ok := r[k]; !ok {
			t.Fatalf("result missing %s", k)
		}
	}
	if _, ok := r["TTFTSamples"]; ok || strings.Contains(string(raw), "Samples") {
		t.Fatal("raw samples leaked into the JSON")
	}
}

func TestMarkdownAndPNG(t *testing.T) {
	var b bytes.Buffer
	sample().Markdown(&b)
	md := b.String()
	if !strings.Contains(md, "| kv_cache_aware | 35.0% | 1 / 2 / 3 |") || !strings.Contains(md, "40.0%") {
		t.Fatalf("table:\n%s", md)
	}
	path := filepath.Join(t.TempDir(), "r.png")
	if err := sample().WritePNG(path); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if err := sample().WritePNG(filepath.Join(t.TempDir(), "no", "such", "dir.png")); err == nil {
		t.Fatal("unwritable path accepted")
	}
}
