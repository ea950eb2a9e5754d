package simserver

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
)

// handleMetrics serves the engine's state under vLLM's metric names and
// labels (model_name, engine) in the Prometheus text exposition format
// (version 0.0.4), which is what vLLM's Python client emits.
//
// It is written out directly rather than through prometheus/common's
// encoder: expfmt v0.73.1 does not build on this project's machines (its
// go-abnf dependency cannot be fetched). The tests parse the output with a
// strict line parser; once the module pin moves, expfmt can take over.
func (s *Server) handleMetrics(w http.ResponseWriter, _ *http.Request) {
	st := s.Stats()
	base := map[string]string{"engine": "0", "model_name": s.opt.Model}
	type family struct {
		name, help, typ string
		value           float64
		extra           map[string]string
	}
	fams := []family{
		{"vllm:num_requests_running", "Number of requests in model execution batches.", "gauge", float64(st.Running), nil},
		{"vllm:num_requests_waiting", "Number of requests waiting to be processed.", "gauge", float64(st.Waiting), nil},
		{"vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "gauge", st.KVUsage, nil},
		// vLLM's counters carry the _total suffix the Python client adds;
		// these are the names a scraper sees.
		{"vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", "counter", float64(st.PrefixQueries), nil},
		{"vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", "counter", float64(st.PrefixHits), nil},
		{"vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", "counter", float64(st.Preemptions), nil},
		{"vllm:prompt_tokens_total", "Number of prefill tokens processed.", "counter", float64(st.PromptTokens), nil},
		{"vllm:generation_tokens_total", "Number of generation tokens processed.", "counter", float64(st.GenerationTokens), nil},
		{"vllm:cache_config_info", "Information of the LLMEngine CacheConfig", "gauge", 1, map[string]string{
			"block_size":             strconv.Itoa(st.BlockSize),
			"enable_prefix_caching":  "True",
			"gpu_memory_utilization": strconv.FormatFloat(s.prof.GPUMemUtil, 'f', -1, 64),
			"num_gpu_blocks":         strconv.Itoa(st.NumGPUBlocks),
		}},
	}
	var b strings.Builder
	for _, f := range fams {
		labels := map[string]string{}
		for k, v := range base {
			labels[k] = v
		}
		for k, v := range f.extra {
			labels[k] = v
		}
		keys := make([]string, 0, len(labels))
		for k := range labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n%s{", f.name, f.help, f.name, f.typ, f.name)
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s=%s", k, strconv.Quote(labels[k]))
		}
		fmt.Fprintf(&b, "} %s\n", pyFloat(f.value))
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	io.WriteString(w, b.String())
}

// orcaHeader builds vLLM's endpoint-load-metrics value for the requested
// format: "TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=2.0"
// or "JSON {"named_metrics": {...}}". Other formats get no header, as in vLLM.
func (s *Server) orcaHeader(format string) string {
	st := s.Stats()
	named := []struct {
		k string
		v float64
	}{{"kv_cache_usage_perc", st.KVUsage}, {"num_requests_waiting", float64(st.Waiting)}, {"num_requests_running", float64(st.Running)}}
	switch strings.ToLower(strings.TrimSpace(format)) {
	case "text":
		parts := make([]string, len(named))
		for i, n := range named {
			parts[i] = "named_metrics." + n.k + "=" + pyFloat(n.v)
		}
		return "TEXT " + strings.Join(parts, ", ")
	case "json":
		m := map[string]float64{}
		for _, n := range named {
			m[n.k] = n.v
		}
		b, _ := json.Marshal(map[string]any{"named_metrics": m})
		return "JSON " + string(b)
	}
	return ""
}

// pyFloat formats like Python's str(float): always with a decimal point.
func pyFloat(v float64) string {
	s := strconv.FormatFloat(v, 'g', -1, 64)
	if !strings.ContainsAny(s, ".eEn") {
		s += ".0"
	}
	return s
}
