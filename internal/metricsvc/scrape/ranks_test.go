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
