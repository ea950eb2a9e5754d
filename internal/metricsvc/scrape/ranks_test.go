package scrape

import (
	"strings"
	"testing"
)

// vLLM with --data-parallel-size labels each rank's series engine="<rank>":
// the sample keeps each rank's queue, and the host's total stays the sum.
func TestParseVLLMDataParallelRanks(t *testing.T) {
	var p Parser
	s, err := p.Parse(strings.NewReader(`vllm:num_requests_waiting{engine="0",model_name="m"} 7
vllm:num_requests_waiting{engine="1",model_name="m"} 1
vllm:num_requests_running{engine="1",model_name="m"} 4
vllm:num_requests_running{engine="0",model_name="m"} 2
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.75
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []Rank{{Waiting: 7, Running: 2, KVUsage: 0.75}, {Waiting: 1, Running: 4, KVUsage: 0.25}}
	if len(s.Ranks) != 2 || s.Ranks[0] != want[0] || s.Ranks[1] != want[1] {
		t.Errorf("ranks %+v, want %+v", s.Ranks, want)
	}
	if s.Waiting != 8 || s.Running != 6 {
		t.Errorf("totals %d waiting %d running, want 8 and 6", s.Waiting, s.Running)
	}
	// One engine, or labels that are not 0..n-1: no ranks.
	for _, page := range []string{
		"vllm:num_requests_waiting{engine=\"0\"} 3\n",
		"vllm:num_requests_waiting{engine=\"0\"} 3\nvllm:num_requests_waiting{engine=\"5\"} 3\n",
	} {
		if s, err := p.Parse(strings.NewReader(page)); err != nil || s.Ranks != nil {
			t.Errorf("%q: ranks %+v, err %v; want none", page, s.Ranks, err)
		}
	}
}

// SGLang with --dp-size and DP attention labels each rank's scheduler
// series dp_rank="<rank>" (tp_rank names the scheduler that exports it; with
// every scheduler exporting, a rank's attention TP ranks repeat its
// numbers): one queue per rank, and the host's total counts each rank once.
func TestParseSGLangDataParallelRanks(t *testing.T) {
	var p Parser
	s, err := p.Parse(strings.NewReader(`sglang:num_queue_reqs{dp_rank="0",model_name="glm",tp_rank="0"} 5
sglang:num_queue_reqs{dp_rank="0",model_name="glm",tp_rank="1"} 5
sglang:num_queue_reqs{dp_rank="1",model_name="glm",tp_rank="2"} 0
sglang:num_queue_reqs{dp_rank="1",model_name="glm",tp_rank="3"} 0
sglang:num_running_reqs{dp_rank="0",model_name="glm",tp_rank="0"} 1
sglang:num_running_reqs{dp_rank="1",model_name="glm",tp_rank="2"} 9
sglang:token_usage{dp_rank="0",model_name="glm",tp_rank="0"} 0.5
sglang:token_usage{dp_rank="1",model_name="glm",tp_rank="2"} 0.1
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []Rank{{Waiting: 5, Running: 1, KVUsage: 0.5}, {Waiting: 0, Running: 9, KVUsage: 0.1}}
	if s.Engine != "sglang" || len(s.Ranks) != 2 || s.Ranks[0] != want[0] || s.Ranks[1] != want[1] {
		t.Fatalf("engine %q ranks %+v, want sglang %+v", s.Engine, s.Ranks, want)
	}
	if s.Waiting != 5 || s.Running != 10 || s.KVUsage < 0.299 || s.KVUsage > 0.301 {
		t.Errorf("totals %d waiting %d running %.3f KV, want 5, 10 and 0.3", s.Waiting, s.Running, s.KVUsage)
	}
	// Without dp_rank (no DP, or DP without DP attention: one scheduler
	// series per engine) the series are one host, as before.
	s, err = p.Parse(strings.NewReader("sglang:num_queue_reqs{model_name=\"m\",tp_rank=\"0\"} 3\n"))
	if err != nil || s.Ranks != nil || s.Waiting != 3 {
		t.Errorf("no dp_rank: ranks %+v waiting %d err %v; want none, 3", s.Ranks, s.Waiting, err)
	}
}
