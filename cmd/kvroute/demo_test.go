package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/testenv"
)

// The demo end to end, compressed: the real module in the Wasm host in
// front of live simulated engines 20 times faster than real time. The
// default profile must find the prefixes round robin scatters, and the
// output must be a valid bench-contract document with its plot.
func TestDemoEndToEnd(t *testing.T) {
	demoModule := testenv.ModulePath(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "demo.json")
	var stdout, stderr bytes.Buffer
	o := demoOptions{wasm: demoModule, replicas: 4, strategies: "round_robin,kv_cache_aware", out: out,
		timeScale: 0.05, kvBlocks: 5000, seed: 1, scale: 2}
	if err := runDemo(context.Background(), o, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	validateBenchJSON(t, raw, []string{"round_robin", "kv_cache_aware"}, 4)
	var rep struct {
		Ceiling float64 `json:"ceiling_hit_ratio"`
		Results []struct {
			Strategy string  `json:"strategy"`
			Hit      float64 `json:"cache_hit_ratio"`
			Requests int     `json:"requests"`
		} `json:"results"`
	}
	json.Unmarshal(raw, &rep)
	rr, kv := rep.Results[0], rep.Results[1]
	t.Logf("round robin %.3f, kv_cache_aware %.3f, ceiling %.3f", rr.Hit, kv.Hit, rep.Ceiling)
	if kv.Hit < rr.Hit+0.15 {
		t.Fatalf("through the Wasm filter kv_cache_aware hit %.3f, round robin %.3f: want at least 15 pp more", kv.Hit, rr.Hit)
	}
	if kv.Hit > rep.Ceiling+0.01 {
		t.Fatalf("hit ratio %.3f above the ceiling %.3f", kv.Hit, rep.Ceiling)
	}
	if _, err := os.Stat(strings.TrimSuffix(out, ".json") + ".png"); err != nil {
		t.Fatalf("no plot: %v", err)
	}
	if !strings.Contains(stdout.String(), "| kv_cache_aware |") {
		t.Fatalf("no comparison table:\n%s", stdout.String())
	}
}

func TestDemoNeedsTheModule(t *testing.T) {
	err := runDemo(context.Background(), demoOptions{wasm: filepath.Join(t.TempDir(), "none.wasm"), replicas: 1, timeScale: 1, kvBlocks: 1, scale: 1}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "make wasm") {
		t.Fatalf("missing module: %v", err)
	}
}
