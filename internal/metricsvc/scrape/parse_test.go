package scrape

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
)

func parseFile(t *testing.T, name string) Sample {
	t.Helper()
	f, err := os.Open("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var p Parser
	s, err := p.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestParseVLLM(t *testing.T) {
	s := parseFile(t, "vllm.txt")
	if s.Engine != "vllm" || s.Model != "meta-llama/Llama-3.1-8B-Instruct" {
		t.Errorf("engine/model = %q/%q", s.Engine, s.Model)
	}
	// two engine cores: queues add up, KV use averages
	if s.Waiting != 5 || s.Running != 5 || s.KVUsage != 0.375 {
		t.Errorf("waiting=%d running=%d kv=%v, want 5 5 0.375", s.Waiting, s.Running, s.KVUsage)
	}
	if s.BlockSize != 16 || s.NumGPUBlocks != 27000 {
		t.Errorf("cache config = %d x %d", s.BlockSize, s.NumGPUBlocks)
	}
	// the newest lora_requests_info series wins
	if !slices.Equal(s.Adapters, []string{"alpaca", "sql-lora"}) || s.MaxAdapters != 2 {
		t.Errorf("adapters = %v of %d, want [alpaca sql-lora] of 2", s.Adapters, s.MaxAdapters)
	}
}

// A waiting adapter takes a slot as a running one does (the engine loads
// it as soon as it admits its request); max_lora is the slot count.
func TestParseVLLMAdapterSlots(t *testing.T) {
	var p Parser
	s, err := p.Parse(strings.NewReader(`vllm:num_requests_running 3
vllm:lora_requests_info{max_lora="4",running_lora_adapters="fin,legal",waiting_lora_adapters="med,fin"} 1.79e+09
`))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.Adapters, []string{"fin", "legal", "med"}) || s.MaxAdapters != 4 {
		t.Errorf("adapters = %v of %d, want [fin legal med] of 4", s.Adapters, s.MaxAdapters)
	}
	// Without LoRA (no such family) capacity stays unknown.
	if s, err = p.Parse(strings.NewReader("vllm:num_requests_running 3\n")); err != nil || s.MaxAdapters != 0 || s.Adapters != nil {
		t.Errorf("no LoRA: %v of %d (%v)", s.Adapters, s.MaxAdapters, err)
	}
}

// SGLang's LoRA pool gauges count occupied slots, idle adapters included,
// and name none: they do not say that a host is full, so none is read.
func TestParseSGLangLoRAPoolIgnored(t *testing.T) {
	var p Parser
	s, err := p.Parse(strings.NewReader(`sglang:num_running_reqs 2
sglang:lora_pool_slots_used 8
sglang:lora_pool_slots_total 8
`))
	if err != nil {
		t.Fatal(err)
	}
	if s.MaxAdapters != 0 || s.Adapters != nil {
		t.Errorf("adapters = %v of %d, want none of unknown", s.Adapters, s.MaxAdapters)
	}
}

func TestParseSGLang(t *testing.T) {
	s := parseFile(t, "sglang.txt")
	if s.Engine != "sglang" || s.Waiting != 2 || s.Running != 6 || s.KVUsage != 0.75 || s.Model != "Qwen/Qwen2.5-7B" {
		t.Errorf("sample = %+v", s)
	}
	// no cache_config_info: block size unknown, so no block count either
	if s.BlockSize != 0 || s.NumGPUBlocks != 0 {
		t.Errorf("cache = %d x %d", s.BlockSize, s.NumGPUBlocks)
	}
	var p Parser
	s, err := p.Parse(strings.NewReader(`sglang:num_queue_reqs 1
sglang:cache_config_info{page_size="32"} 1
sglang:max_total_num_tokens 65536
`))
	if err != nil {
		t.Fatal(err)
	}
	if s.BlockSize != 32 || s.NumGPUBlocks != 2048 {
		t.Errorf("derived cache = %d x %d, want 32 x 2048", s.BlockSize, s.NumGPUBlocks)
	}
	s, err = p.Parse(strings.NewReader("sglang:num_queue_reqs 1\nsglang:cache_config_info{page_size=\"16\",num_pages=\"900\"} 1\n"))
	if err != nil || s.BlockSize != 16 || s.NumGPUBlocks != 900 {
		t.Errorf("cache_config_info = %+v, %v", s, err)
	}
}

func TestParseOlderVLLMKVName(t *testing.T) {
	var p Parser
	s, err := p.Parse(strings.NewReader(`# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 2
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.9
`))
	if err != nil || s.KVUsage != 0.9 || s.Waiting != 2 {
		t.Fatalf("%+v %v", s, err)
	}
}

func TestParseBadInput(t *testing.T) {
	cases := []struct {
		name, text string
		wantErr    bool
	}{
		{"unknown type on an unrelated family is ignored",
			"# TYPE foo_bar weirdtype\nfoo_bar 1\nvllm:num_requests_waiting 3\n", false},
		{"unknown type on a family we read",
			"# TYPE vllm:num_requests_waiting weirdtype\nvllm:num_requests_waiting 3\n", true},
		{"malformed sample line", "vllm:num_requests_waiting{model_name=\"m\" 3\n", true},
		{"non-numeric value", "vllm:num_requests_waiting not-a-number\n", true},
		{"negative count", "vllm:num_requests_waiting -2\n", true},
		{"NaN count", "vllm:num_requests_running NaN\n", true},
		{"histogram where a gauge is expected",
			"# TYPE vllm:num_requests_waiting histogram\nvllm:num_requests_waiting_bucket{le=\"+Inf\"} 1\nvllm:num_requests_waiting_count 1\nvllm:num_requests_waiting_sum 1\n", true},
		{"not an engine", "# TYPE up gauge\nup 1\n", true},
		{"empty", "", true},
		{"html error page", "<html><body>502 Bad Gateway</body></html>\n", true},
		{"absurd count", "vllm:num_requests_waiting 1e308\n", true},
		{"missing trailing newline", "vllm:num_requests_waiting 3", false},
	}
	for _, c := range cases {
		var p Parser
		_, err := p.Parse(strings.NewReader(c.text))
		if (err != nil) != c.wantErr {
			t.Errorf("%s: err = %v, wantErr %v", c.name, err, c.wantErr)
		}
	}
	var p Parser
	if _, err := p.Parse(strings.NewReader("up 1\n")); !errors.Is(err, ErrNoEngineMetrics) {
		t.Errorf("err = %v, want ErrNoEngineMetrics", err)
	}
}

func TestParseTooLarge(t *testing.T) {
	var p Parser
	big := strings.Repeat("# filler line that is not a metric\n", MaxBodyBytes/30)
	if _, err := p.Parse(strings.NewReader(big)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("err = %v, want ErrTooLarge", err)
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{"vllm.txt", "sglang.txt"} {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Add("vllm:num_requests_waiting{a=\"\\\"\"} 1e308\n")
	f.Fuzz(func(t *testing.T, text string) {
		var p Parser
		s, err := p.Parse(strings.NewReader(text))
		if err != nil {
			return
		}
		if s.Waiting < 0 || s.Running < 0 || s.KVUsage < 0 || s.KVUsage > 1 || s.BlockSize < 0 || s.NumGPUBlocks < 0 {
			t.Fatalf("out of range sample %+v", s)
		}
	})
}
