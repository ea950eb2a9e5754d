// Package scrape reads an engine's Prometheus /metrics and reduces it to the
// few numbers a router needs: queue (waiting, running), KV cache use, KV
// capacity (block size and block count), model and loaded LoRA adapters.
//
// vLLM and SGLang are recognised by their metric names:
//
//	snapshot field   vLLM                                               SGLang
//	Waiting          vllm:num_requests_waiting                          sglang:num_queue_reqs
//	Running          vllm:num_requests_running                          sglang:num_running_reqs
//	KVUsage          vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc) sglang:token_usage
//	BlockSize        vllm:cache_config_info{block_size}                 sglang:cache_config_info{page_size}
//	NumGPUBlocks     vllm:cache_config_info{num_gpu_blocks}             sglang:cache_config_info{num_pages}
//	                                                                    (or sglang:max_total_num_tokens / page size)
//	Adapters         vllm:lora_requests_info{running_lora_adapters,     -
//	                   waiting_lora_adapters}
//	MaxAdapters      vllm:lora_requests_info{max_lora}                  -
//	Model            model_name label of the queue series               model_name label
//
// Parsing uses prometheus/common's expfmt. Only the lines of those families
// are handed to it: an engine's exposition is mostly latency histograms
// (hundreds of bucket lines) that a 100 ms scrape loop would otherwise parse
// ten times a second for nothing, and an exotic or malformed family
// elsewhere in the page cannot fail the scrape. A malformed line in one of
// the families read is still an error.
//
// SGLang names no adapters: with LoRA enabled it exports only
// sglang:lora_pool_slots_used and sglang:lora_pool_slots_total, the GPU
// pool's occupancy, and the pool keeps idle adapters until a new one
// evicts them, so a full pool does not mean a new adapter waits. Neither
// is read: SGLang hosts carry the adapters discovery declares and no
// adapter capacity (docs/configuration.md, LoRA adapters).
package scrape

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is what one scrape says about an engine.
type Sample struct {
	// Engine is "vllm" or "sglang", whichever names were found.
	Engine           string
	Model            string
	Waiting, Running int
	KVUsage          float64
	BlockSize        int
	NumGPUBlocks     int
	// Adapters are the LoRA adapters with requests running or waiting on
	// the engine, sorted: each holds (or is about to take) one of the
	// engine's MaxAdapters slots (vLLM's max_lora, --max-loras; 0 when the
	// engine does not say). A request for another adapter waits while
	// every slot is taken.
	Adapters    []string
	MaxAdapters int
	// Ranks is the queue of each data-parallel rank, indexed by rank, when
	// the series name more than one (vLLM: label engine="<rank>", SGLang:
	// dp_rank="<rank>", 0..n-1); nil for one.
	Ranks []Rank
}

// Rank is one data-parallel rank's queue and KV usage.
type Rank struct {
	Waiting, Running int
	KVUsage          float64
}

const (
	vllmWaiting     = "vllm:num_requests_waiting"
	vllmRunning     = "vllm:num_requests_running"
	vllmKVUsage     = "vllm:kv_cache_usage_perc"
	vllmKVUsageOld  = "vllm:gpu_cache_usage_perc"
	vllmCacheConfig = "vllm:cache_config_info"
	vllmLoRA        = "vllm:lora_requests_info"
	sglWaiting      = "sglang:num_queue_reqs"
	sglRunning      = "sglang:num_running_reqs"
	sglKVUsage      = "sglang:token_usage"
	sglCacheConfig  = "sglang:cache_config_info"
	sglMaxTokens    = "sglang:max_total_num_tokens"
)

var wanted = map[string]bool{
	vllmWaiting: true, vllmRunning: true, vllmKVUsage: true, vllmKVUsageOld: true,
	vllmCacheConfig: true, vllmLoRA: true,
	sglWaiting: true, sglRunning: true, sglKVUsage: true, sglCacheConfig: true, sglMaxTokens: true,
}

// MaxBodyBytes bounds one /metrics response. vLLM's page is tens of KiB;
// a multi-megabyte answer is a misconfigured target, not an engine.
const MaxBodyBytes = 16 << 20

// ErrNoEngineMetrics means the page parsed but holds none of the vLLM or
// SGLang queue metrics: the target is probably not an engine's /metrics.
var ErrNoEngineMetrics = errors.New("no vLLM or SGLang queue metrics found (is the address an engine's /metrics, and is the engine started with metrics enabled?)")

// ErrTooLarge means the page exceeded MaxBodyBytes.
var ErrTooLarge = fmt.Errorf("metrics page larger than %d bytes", MaxBodyBytes)

// Parser parses metrics pages. It reuses its buffers, so keep one per
// scrape loop; it is not safe for concurrent use.
type Parser struct {
	filtered bytes.Buffer
}

// Parse reads one text-format exposition (version 0.0.4, as vLLM and SGLang
// serve it) and extracts a Sample.
func (p *Parser) Parse(r io.Reader) (Sample, error) {
	if err := p.filter(io.LimitReader(r, MaxBodyBytes+1)); err != nil {
		return Sample{}, err
	}
	// A parser left at its zero value has no name validation scheme and
	// panics on the first name, so the scheme is always chosen here. UTF-8
	// validation accepts the colon-namespaced names engines use
	// (vllm:num_requests_waiting) as well as anything newer.
	tp := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := tp.TextToMetricFamilies(&p.filtered)
	if err != nil {
		return Sample{}, fmt.Errorf("parse metrics: %w", err)
	}
	return extract(fams)
}

// filter copies the HELP, TYPE and sample lines of the wanted families.
func (p *Parser) filter(r io.Reader) error {
	p.filtered.Reset()
	br := bufio.NewReaderSize(r, 64<<10)
	total := 0
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// A line longer than the buffer: keep reading it to the end.
			long := append([]byte(nil), line...)
			for err == bufio.ErrBufferFull {
				line, err = br.ReadSlice('\n')
				long = append(long, line...)
			}
			line = long
		}
		total += len(line)
		if total > MaxBodyBytes {
			return ErrTooLarge
		}
		if len(line) > 0 && keep(line) {
			p.filtered.Write(line)
			if line[len(line)-1] != '\n' {
				p.filtered.WriteByte('\n')
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read metrics: %w", err)
		}
	}
}

func keep(line []byte) bool {
	if line[0] == '#' {
		// "# HELP name ..." / "# TYPE name ..."
		rest, ok := bytes.CutPrefix(line, []byte("# HELP "))
		if !ok {
			rest, ok = bytes.CutPrefix(line, []byte("# TYPE "))
		}
		if !ok {
			return false
		}
		end := bytes.IndexAny(rest, " \t\n")
		if end < 0 {
			end = len(rest)
		}
		return wanted[string(rest[:end])]
	}
	end := bytes.IndexAny(line, "{ \t")
	if end <= 0 {
		return false
	}
	return wanted[string(line[:end])]
}

func extract(fams map[string]*dto.MetricFamily) (Sample, error) {
	var s Sample
	switch {
	case fams[vllmWaiting] != nil || fams[vllmRunning] != nil:
		s.Engine = "vllm"
		w, err := sum(fams[vllmWaiting])
		if err != nil {
			return s, err
		}
		r, err := sum(fams[vllmRunning])
		if err != nil {
			return s, err
		}
		s.Waiting, s.Running = w, r
		s.Model = modelName(fams[vllmWaiting], fams[vllmRunning])
		kv := fams[vllmKVUsage]
		if kv == nil {
			kv = fams[vllmKVUsageOld]
		}
		if s.KVUsage, err = mean(kv); err != nil {
			return s, err
		}
		s.Ranks = ranks(fams[vllmWaiting], fams[vllmRunning], kv, "engine")
		if cc := latest(fams[vllmCacheConfig]); cc != nil {
			s.BlockSize = labelInt(cc, "block_size")
			s.NumGPUBlocks = labelInt(cc, "num_gpu_blocks")
		}
		if lr := latest(fams[vllmLoRA]); lr != nil {
			s.Adapters = splitList(label(lr, "running_lora_adapters") + "," + label(lr, "waiting_lora_adapters"))
			s.MaxAdapters = labelInt(lr, "max_lora")
		}
	case fams[sglWaiting] != nil || fams[sglRunning] != nil:
		s.Engine = "sglang"
		w, err := sum(fams[sglWaiting])
		if err != nil {
			return s, err
		}
		r, err := sum(fams[sglRunning])
		if err != nil {
			return s, err
		}
		s.Waiting, s.Running = w, r
		s.Model = modelName(fams[sglWaiting], fams[sglRunning])
		if s.KVUsage, err = mean(fams[sglKVUsage]); err != nil {
			return s, err
		}
		if s.Ranks = ranks(fams[sglWaiting], fams[sglRunning], fams[sglKVUsage], "dp_rank"); s.Ranks != nil {
			s.totalRanks() // a rank's schedulers may each export it
		}
		if cc := latest(fams[sglCacheConfig]); cc != nil {
			s.BlockSize = labelInt(cc, "page_size")
			s.NumGPUBlocks = labelInt(cc, "num_pages")
		}
		if s.NumGPUBlocks == 0 && s.BlockSize > 0 {
			if m := latest(fams[sglMaxTokens]); m != nil {
				if v := value(m); v > 0 && !math.IsInf(v, 0) {
					s.NumGPUBlocks = int(v) / s.BlockSize
				}
			}
		}
	default:
		return s, ErrNoEngineMetrics
	}
	return s, nil
}

// ranks splits an engine's queue by data-parallel rank, read from label:
// vLLM labels each rank's series engine="<rank>", SGLang (--dp-size with
// DP attention) dp_rank="<rank>". It returns nil unless the rank labels are
// exactly 0..n-1 with n >= 2 (anything else is summed, as before). SGLang
// may export a rank's numbers from each of its attention tensor-parallel
// schedulers (tp_rank differs, the batch is the same): the largest value of
// a rank stands for it. extract has checked the values.
func ranks(waiting, running, kv *dto.MetricFamily, label string) []Rank {
	n := rankCount(waiting, label)
	if n < 2 || n > MaxRanks {
		return nil
	}
	out := make([]Rank, n)
	seen := make([]bool, n)
	for _, f := range []*dto.MetricFamily{waiting, running, kv} {
		if f == nil {
			continue
		}
		for _, m := range f.Metric {
			i, ok := rankLabel(m, label, n)
			if !ok {
				return nil
			}
			v := value(m)
			switch f {
			case waiting:
				out[i].Waiting, seen[i] = max(out[i].Waiting, int(v)), true
			case running:
				out[i].Running = max(out[i].Running, int(v))
			default:
				out[i].KVUsage = max(out[i].KVUsage, min(max(v, 0), 1))
			}
		}
	}
	for _, ok := range seen {
		if !ok {
			return nil
		}
	}
	return out
}

// totalRanks sets the host's queue and KV usage from its ranks': the sum
// of their queues and the mean of their usage.
func (s *Sample) totalRanks() {
	s.Waiting, s.Running, s.KVUsage = 0, 0, 0
	for _, r := range s.Ranks {
		s.Waiting += r.Waiting
		s.Running += r.Running
		s.KVUsage += r.KVUsage
	}
	s.KVUsage /= float64(len(s.Ranks))
}

// rankCount is how many distinct values f's series give label (0 for a
// series without it).
func rankCount(f *dto.MetricFamily, name string) int {
	if f == nil {
		return 0
	}
	var vals []string
	for _, m := range f.Metric {
		v := label(m, name)
		if v == "" {
			return 0
		}
		if !slices.Contains(vals, v) {
			vals = append(vals, v)
		}
	}
	return len(vals)
}

// rankLabel reads a series' rank label, a number below n.
func rankLabel(m *dto.Metric, name string, n int) (int, bool) {
	i, err := strconv.Atoi(label(m, name))
	return i, err == nil && i >= 0 && i < n
}

// MaxRanks matches the gateway's bound on an endpoint's ranks
// (snapshot.MaxDataParallelSize).
const MaxRanks = 64

// value reads a gauge, counter or untyped sample; NaN when it has none.
func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	}
	return math.NaN()
}

func checkType(f *dto.MetricFamily) error {
	switch f.GetType() {
	case dto.MetricType_GAUGE, dto.MetricType_UNTYPED, dto.MetricType_COUNTER:
		return nil
	}
	return fmt.Errorf("metric %s has type %s, want a gauge", f.GetName(), f.GetType())
}

// maxCount bounds a plausible queue length; larger values are garbage.
const maxCount = 1 << 30

// sum adds a family's series: vLLM labels one series per engine core (and
// DP rank), and the host's queue is their total.
func sum(f *dto.MetricFamily) (int, error) {
	if f == nil {
		return 0, nil
	}
	if err := checkType(f); err != nil {
		return 0, err
	}
	total := 0.0
	for _, m := range f.Metric {
		v := value(m)
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > maxCount {
			return 0, fmt.Errorf("metric %s has value %v, want a count", f.GetName(), v)
		}
		total += v
	}
	return int(math.Round(min(total, maxCount))), nil
}

// mean averages a fraction across series, clamped to 0..1.
func mean(f *dto.MetricFamily) (float64, error) {
	if f == nil || len(f.Metric) == 0 {
		return 0, nil
	}
	if err := checkType(f); err != nil {
		return 0, err
	}
	total := 0.0
	for _, m := range f.Metric {
		v := value(m)
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return 0, fmt.Errorf("metric %s has value %v, want a fraction", f.GetName(), v)
		}
		total += v
	}
	return min(max(total/float64(len(f.Metric)), 0), 1), nil
}

// latest picks the series with the largest value: info gauges such as
// vllm:lora_requests_info carry a timestamp as their value, and an old label
// set can linger beside the current one.
func latest(f *dto.MetricFamily) *dto.Metric {
	if f == nil || checkType(f) != nil {
		return nil
	}
	var best *dto.Metric
	for _, m := range f.Metric {
		if best == nil || value(m) > value(best) {
			best = m
		}
	}
	return best
}

func label(m *dto.Metric, name string) string {
	for _, lp := range m.Label {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

func labelInt(m *dto.Metric, name string) int {
	v := label(m, name)
	n, err := strconv.Atoi(v)
	if err != nil {
		// vLLM formats Python values: "16", "None", sometimes "16.0".
		f, ferr := strconv.ParseFloat(v, 64)
		if ferr != nil || f < 0 || f > math.MaxInt32 {
			return 0
		}
		return int(f)
	}
	return max(n, 0)
}

func modelName(fs ...*dto.MetricFamily) string {
	for _, f := range fs {
		if f == nil {
			continue
		}
		for _, m := range f.Metric {
			if v := label(m, "model_name"); v != "" {
				return v
			}
		}
	}
	return ""
}

func splitList(v string) []string {
	var out []string
	for _, part := range strings.Split(v, ",") {
		if part = strings.TrimSpace(part); part != "" && !slices.Contains(out, part) {
			out = append(out, part)
		}
	}
	slices.Sort(out)
	return out
}
