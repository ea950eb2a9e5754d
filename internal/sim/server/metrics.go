package server

import (
	"encoding/json"
	"net/http"
	"sort"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/protobuf/proto"
)

// handleMetrics serves the engine's state under vLLM's metric names and
// labels (model_name, engine) in the Prometheus text format, encoded by
// prometheus/common's expfmt from client_model metric families.
func (s *Server) handleMetrics(w http.ResponseWriter, _ *http.Request) {
	st := s.Stats()
	base := map[string]string{"engine": "0", "model_name": s.opt.Model}
	family := func(name, help string, typ dto.MetricType, v float64, extra map[string]string) *dto.MetricFamily {
		labels := map[string]string{}
		for k, x := range base {
			labels[k] = x
		}
		for k, x := range extra {
			labels[k] = x
		}
		keys := make([]string, 0, len(labels))
		for k := range labels {
			keys = append(keys, k)
		}
		sort.Strings(keys) // the exposition wants labels in name order
		m := &dto.Metric{}
		for _, k := range keys {
			m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(k), Value: proto.String(labels[k])})
		}
		if typ == dto.MetricType_COUNTER {
			m.Counter = &dto.Counter{Value: proto.Float64(v)}
		} else {
			m.Gauge = &dto.Gauge{Value: proto.Float64(v)}
		}
		return &dto.MetricFamily{Name: proto.String(name), Help: proto.String(help), Type: typ.Enum(), Metric: []*dto.Metric{m}}
	}
	gauge, counter := dto.MetricType_GAUGE, dto.MetricType_COUNTER
	fams := []*dto.MetricFamily{
		family("vllm:num_requests_running", "Number of requests in model execution batches.", gauge, float64(st.Running), nil),
		family("vllm:num_requests_waiting", "Number of requests waiting to be processed.", gauge, float64(st.Waiting), nil),
		family("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", gauge, st.KVUsage, nil),
		// vLLM's counters carry the _total suffix its Python client adds;
		// these are the names a scraper sees.
		family("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", counter, float64(st.PrefixQueries), nil),
		family("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", counter, float64(st.PrefixHits), nil),
		family("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", counter, float64(st.Preemptions), nil),
		family("vllm:prompt_tokens_total", "Number of prefill tokens processed.", counter, float64(st.PromptTokens), nil),
		family("vllm:generation_tokens_total", "Number of generation tokens processed.", counter, float64(st.GenerationTokens), nil),
		family("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", gauge, 1, map[string]string{
			"block_size":             strconv.Itoa(st.BlockSize),
			"enable_prefix_caching":  "True",
			"gpu_memory_utilization": strconv.FormatFloat(s.prof.GPUMemUtil, 'f', -1, 64),
			"num_gpu_blocks":         strconv.Itoa(st.NumGPUBlocks),
		}),
	}
	w.Header().Set("Content-Type", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	for _, f := range fams {
		if _, err := expfmt.MetricFamilyToText(w, f); err != nil {
			return // the client went away
		}
	}
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
