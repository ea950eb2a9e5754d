package sim

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Profile is the cost model of one engine replica: the model's shape, the
// hardware it runs on, and the vLLM scheduler limits that shape its batches.
//
// Step time is a roofline: a step takes as long as the slower of its compute
// (linear layers plus attention over each token's context) and its memory
// traffic (weights once per step plus every scheduled sequence's KV cache),
// plus a fixed per-step overhead and, under tensor parallelism, the
// all-reduce traffic. That single formula gives the behaviours routing
// depends on: prefill cost linear in uncached tokens with attention growing
// with context, and a decode step that stays nearly flat with batch size
// (weight reads dominate) until the batch turns it compute-bound, with a
// KV-read term that grows with the batch's total context.
type Profile struct {
	Name string

	// Model shape (from the model's published config.json).
	Params     float64 // parameters
	Layers     int
	Hidden     int // d_model = attention heads x head dim
	KVHeads    int
	HeadDim    int
	DTypeBytes int // bytes per weight and per KV element (bf16 = 2)

	// Hardware, for the whole tensor-parallel group.
	GPUs         int
	PeakFLOPS    float64 // dense bf16 per GPU
	MemBandwidth float64 // HBM bytes/s per GPU
	GPUMemory    float64 // bytes per GPU
	LinkBW       float64 // all-reduce bus bandwidth per GPU (bytes/s); used when GPUs > 1

	// Efficiencies: the fraction of peak a real kernel mix reaches.
	ComputeEff float64
	MemoryEff  float64
	// StepOverhead is the fixed CPU/launch cost of one engine step
	// (scheduling, sampling, input preparation).
	StepOverhead time.Duration

	// vLLM engine configuration.
	BlockSize            int     // tokens per KV block (vLLM's default 16)
	GPUMemUtil           float64 // --gpu-memory-utilization (default 0.9)
	ActivationReserve    float64 // bytes per GPU held back for activations and CUDA graphs
	MaxBatchedTokens     int     // --max-num-batched-tokens: per-step token budget
	MaxNumSeqs           int     // --max-num-seqs
	NumGPUBlocksOverride int     // if > 0, replaces the computed KV capacity (tests)

	// LoRA serving (--enable-lora): MaxLoRAs is --max-loras, the adapters
	// a batch holds at once (0: requests' adapters are ignored), and
	// LoRALoadTime what bringing an adapter into a GPU slot adds to the
	// step that needs it (from host memory; more from disk).
	MaxLoRAs     int
	LoRALoadTime time.Duration
}

// KVBytesPerToken is the KV cache size of one token over the whole model:
// K and V, per layer, per KV head.
func (p *Profile) KVBytesPerToken() float64 {
	return float64(2 * p.Layers * p.KVHeads * p.HeadDim * p.DTypeBytes)
}

// WeightBytes is the size of the weights, read once per step.
func (p *Profile) WeightBytes() float64 { return p.Params * float64(p.DTypeBytes) }

// NumGPUBlocks is the KV capacity in blocks, computed the way vLLM sizes it:
// usable memory (utilization x HBM) minus weights and the activation reserve,
// divided by the size of one block.
func (p *Profile) NumGPUBlocks() int {
	if p.NumGPUBlocksOverride > 0 {
		return p.NumGPUBlocksOverride
	}
	g := float64(p.GPUs)
	free := g*p.GPUMemory*p.GPUMemUtil - p.WeightBytes() - g*p.ActivationReserve
	if free <= 0 {
		return 0
	}
	return int(free / (float64(p.BlockSize) * p.KVBytesPerToken()))
}

// SeqWork is one sequence's share of a step: NewTokens computed on top of
// Context tokens already in its KV cache.
type SeqWork struct {
	Context   int
	NewTokens int
}

// StepTime is the duration of one engine step over the given work.
func (p *Profile) StepTime(work []SeqWork) time.Duration {
	var tokens, attnPairs, kvTokens float64
	for _, w := range work {
		n := float64(w.NewTokens)
		tokens += n
		// Causal attention: token j of the chunk attends to Context+j keys.
		attnPairs += n * (float64(w.Context) + (n+1)/2)
		kvTokens += float64(w.Context) + n
	}
	return p.stepTime(tokens, attnPairs, kvTokens)
}

func (p *Profile) stepTime(tokens, attnPairs, kvTokens float64) time.Duration {
	if tokens == 0 {
		return 0
	}
	g := float64(p.GPUs)
	// 2 FLOPs per parameter per token for the matmuls; attention costs
	// 2 FLOPs per (query, key) pair per hidden unit for QK^T and again for
	// the weighted sum over V.
	flops := 2*p.Params*tokens + 4*float64(p.Layers*p.Hidden)*attnPairs
	compute := flops / (g * p.PeakFLOPS * p.ComputeEff)
	bytes := p.WeightBytes() + p.KVBytesPerToken()*kvTokens
	memory := bytes / (g * p.MemBandwidth * p.MemoryEff)
	sec := compute
	if memory > sec {
		sec = memory
	}
	if p.GPUs > 1 && p.LinkBW > 0 {
		// Two ring all-reduces of the hidden state per layer per token.
		perToken := 2 * float64(p.Layers*p.Hidden*p.DTypeBytes) * 2 * (g - 1) / g
		sec += perToken * tokens / p.LinkBW
	}
	return p.StepOverhead + time.Duration(sec*float64(time.Second))
}

// PrefillTime is the time to prefill `uncached` tokens after `cached` ones
// on an otherwise idle engine, in chunks of MaxBatchedTokens. It is the
// quantity a cache hit saves.
func (p *Profile) PrefillTime(cached, uncached int) time.Duration {
	var d time.Duration
	ctx := cached
	for uncached > 0 {
		n := min(uncached, p.MaxBatchedTokens)
		d += p.StepTime([]SeqWork{{Context: ctx, NewTokens: n}})
		ctx += n
		uncached -= n
	}
	return d
}

// Sources for the figures below.
//   - H100 SXM5: 989 TFLOPS dense BF16, 3.35 TB/s HBM3, 80 GB; NVLink 4
//     900 GB/s per GPU (NVIDIA H100 Tensor Core GPU datasheet).
//   - Llama 3 8B: 8.03B parameters, 32 layers, hidden 4096, 8 KV heads of
//     dimension 128; Llama 3 70B: 70.6B parameters, 80 layers, hidden 8192,
//     8 KV heads of dimension 128 (Meta's model cards and config.json on
//     Hugging Face).
//   - vLLM defaults on GPUs with >= 70 GiB (not A100), OpenAI server:
//     max_num_batched_tokens 8192, max_num_seqs 1024 (vllm/engine/arg_utils.py,
//     get_batch_defaults); block_size 16; gpu_memory_utilization 0.9.
//   - Efficiencies are assumptions, not measurements: 50% of peak FLOPS in
//     prefill-heavy steps and 80% of HBM bandwidth in decode are typical of
//     FlashAttention/cuBLAS kernels on H100. With them a 1k-token prompt on
//     the 8B model prefills in ~36 ms and a lone decode step takes ~8 ms,
//     the range vLLM reports for this pair; at batch 256 with 1k-token
//     contexts decode runs at ~12,800 tokens/s, against ~12,500 published
//     for vLLM with Llama 3.1 8B on one H100 (third-party benchmarks
//     collected at morphllm.com/vllm-benchmarks), checked by
//     TestDecodeThroughputNearPublishedFigure.
//   - A100 SXM4 80 GB: 312 TFLOPS dense BF16, 2.039 TB/s HBM2e; NVLink 3
//     600 GB/s per GPU (NVIDIA A100 Tensor Core GPU datasheet). vLLM's
//     defaults there (A100 is excluded from the >= 70 GiB rule above):
//     max_num_batched_tokens 2048, max_num_seqs 256. Same efficiencies
//     assumed: a 1k-token prompt prefills in ~106 ms, 3.1x the H100's,
//     and a lone decode step takes ~11 ms.
//     It is the slow half of a heterogeneous fleet (kvroute bench
//     --profile llama3-8b-h100,llama3-8b-a100).
var profiles = map[string]Profile{
	"llama3-8b-a100": {
		Name:   "llama3-8b-a100",
		Params: 8.03e9, Layers: 32, Hidden: 4096, KVHeads: 8, HeadDim: 128, DTypeBytes: 2,
		GPUs: 1, PeakFLOPS: 312e12, MemBandwidth: 2.039e12, GPUMemory: 80e9, LinkBW: 300e9,
		ComputeEff: 0.5, MemoryEff: 0.8, StepOverhead: 1500 * time.Microsecond,
		BlockSize: 16, GPUMemUtil: 0.9, ActivationReserve: 4e9,
		MaxBatchedTokens: 2048, MaxNumSeqs: 256,
	},
	"llama3-8b-h100": {
		Name:   "llama3-8b-h100",
		Params: 8.03e9, Layers: 32, Hidden: 4096, KVHeads: 8, HeadDim: 128, DTypeBytes: 2,
		GPUs: 1, PeakFLOPS: 989e12, MemBandwidth: 3.35e12, GPUMemory: 80e9, LinkBW: 450e9,
		ComputeEff: 0.5, MemoryEff: 0.8, StepOverhead: 1500 * time.Microsecond,
		BlockSize: 16, GPUMemUtil: 0.9, ActivationReserve: 4e9,
		MaxBatchedTokens: 8192, MaxNumSeqs: 1024,
	},
	"llama3-70b-h100-tp4": {
		Name:   "llama3-70b-h100-tp4",
		Params: 70.6e9, Layers: 80, Hidden: 8192, KVHeads: 8, HeadDim: 128, DTypeBytes: 2,
		GPUs: 4, PeakFLOPS: 989e12, MemBandwidth: 3.35e12, GPUMemory: 80e9, LinkBW: 450e9,
		ComputeEff: 0.5, MemoryEff: 0.8, StepOverhead: 2500 * time.Microsecond,
		BlockSize: 16, GPUMemUtil: 0.9, ActivationReserve: 4e9,
		MaxBatchedTokens: 8192, MaxNumSeqs: 1024,
	},
}

// DefaultProfile is the profile used when none is named.
const DefaultProfile = "llama3-8b-h100"

// LookupProfile returns the named profile.
func LookupProfile(name string) (Profile, error) {
	if name == "" {
		name = DefaultProfile
	}
	p, ok := profiles[name]
	if !ok {
		return Profile{}, fmt.Errorf("unknown engine profile %q (known: %s)", name, strings.Join(ProfileNames(), ", "))
	}
	return p, nil
}

// ProfileNames lists the named profiles, sorted.
func ProfileNames() []string {
	names := make([]string, 0, len(profiles))
	for n := range profiles {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
