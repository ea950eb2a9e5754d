// Package report is the output side of `kvroute bench` and `make demo`:
// the bench contract's JSON document (docs/simulator.md, "The bench contract"), its
// markdown table and its plot. Keeping it apart from the simulator lets the
// demo, which measures over real HTTP, report in exactly the same shape.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"time"
)

// Report is the bench contract's top-level document. The field names and
// JSON keys are the contract; other tools read them. Profile, RateScale,
// Seed and Mode are additions that describe the run.
type Report struct {
	Trace           string   `json:"trace"`
	Replicas        int      `json:"replicas"`
	CeilingHitRatio float64  `json:"ceiling_hit_ratio"`
	Results         []Result `json:"results"`

	Profile   string  `json:"profile,omitempty"`
	RateScale float64 `json:"rate_scale,omitempty"`
	Seed      uint64  `json:"seed"`
	// Mode is "simulated" (virtual-time fleet) or "live" (real HTTP).
	Mode string `json:"mode,omitempty"`
	// Gateways and Workers are the simulated topology (0: one of each).
	Gateways int `json:"gateways,omitempty"`
	Workers  int `json:"workers,omitempty"`
	// CacheState is how the routers learn the engines' caches:
	// "approximate" (from their own routing and the engines' cached_tokens)
	// or "precise" (the engines' KV events as well).
	CacheState string `json:"cache_state,omitempty"`
	// Oracles are clairvoyant bounds on the same workload and fleet
	// (fleet.RunOracle): every request gets a cache's best prefix and no
	// queueing. Absent in live mode.
	Oracles []Oracle `json:"oracles,omitempty"`
}

// Oracle is one clairvoyant bound: its name says which cache it assumes.
type Oracle struct {
	Name          string    `json:"name"`
	CacheHitRatio float64   `json:"cache_hit_ratio"`
	TTFTms        P50P90P99 `json:"ttft_ms"`
}

// Result is one strategy's figures.
type Result struct {
	Strategy      string    `json:"strategy"`
	Requests      int       `json:"requests"`
	TTFTms        P50P90P99 `json:"ttft_ms"`
	TPOTms        P50P90    `json:"tpot_ms"`
	E2Ems         P50P99    `json:"e2e_ms"`
	OutputTokPerS float64   `json:"output_tok_per_s"`
	// CacheHitRatio is cached input tokens over all input tokens.
	CacheHitRatio float64 `json:"cache_hit_ratio"`
	// LoadImbalance is max over mean of per-replica busy time.
	LoadImbalance float64 `json:"load_imbalance"`
	// RouterUS is the wall-clock time of one routing decision.
	RouterUS P50P99 `json:"router_us"`
	// PredictionError is the router's block-weighted prediction error:
	// the sum of |predicted - confirmed| cached tokens per request over the
	// confirmed cached tokens (router.Stats.PredictionError). Absent when
	// the run does not see the router's books (live mode).
	PredictionError *float64 `json:"prediction_error,omitempty"`
	// UnqueuedTTFTms is the TTFT the run's own cache hits give with no
	// queueing (fleet.Result.UnqueuedTTFT): what is left of the TTFT when
	// waiting behind other work is taken out. Absent in live mode and on
	// mixed fleets.
	UnqueuedTTFTms *P50P90P99 `json:"unqueued_ttft_ms,omitempty"`

	// TTFTSamples feed the CDF plot; not part of the JSON.
	TTFTSamples []time.Duration `json:"-"`
}

// P50P90P99 are percentiles.
type P50P90P99 struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
}

// P50P90 are percentiles.
type P50P90 struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
}

// P50P99 are percentiles.
type P50P99 struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
}

// Ms converts a duration to milliseconds.
func Ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Us converts a duration to microseconds.
func Us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// WriteJSON writes the report, indented, to path.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write bench results: %w", err)
	}
	return nil
}

// Markdown writes the results as a markdown table, best hit ratio first
// within the order given.
func (r *Report) Markdown(w io.Writer) {
	fmt.Fprintf(w, "| strategy | hit ratio | TTFT p50 / p90 / p99 (ms) | TPOT p50 / p90 (ms) | E2E p50 / p99 (ms) | output tok/s | load imbalance | router p50 / p99 (us) | prediction error |\n")
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range r.Results {
		pe := "-"
		if x.PredictionError != nil {
			pe = fmt.Sprintf("%.1f%%", 100**x.PredictionError)
		}
		fmt.Fprintf(w, "| %s | %.1f%% | %.0f / %.0f / %.0f | %.1f / %.1f | %.0f / %.0f | %.0f | %.2f | %.1f / %.1f | %s |\n",
			x.Strategy, 100*x.CacheHitRatio, x.TTFTms.P50, x.TTFTms.P90, x.TTFTms.P99, x.TPOTms.P50, x.TPOTms.P90,
			x.E2Ems.P50, x.E2Ems.P99, x.OutputTokPerS, x.LoadImbalance, x.RouterUS.P50, x.RouterUS.P99, pe)
	}
	fmt.Fprintf(w, "\nceiling hit ratio (one LRU cache of the whole fleet's KV capacity): %.1f%%\n", 100*r.CeilingHitRatio)
	first := true
	for _, x := range r.Results {
		if x.UnqueuedTTFTms == nil {
			continue
		}
		if first {
			fmt.Fprintf(w, "TTFT p50 / p90 / p99 with each strategy's own cache hits and no queueing (ms):")
			first = false
		}
		fmt.Fprintf(w, " %s %.0f / %.0f / %.0f;", x.Strategy, x.UnqueuedTTFTms.P50, x.UnqueuedTTFTms.P90, x.UnqueuedTTFTms.P99)
	}
	if !first {
		fmt.Fprintln(w)
	}
	for _, o := range r.Oracles {
		fmt.Fprintf(w, "oracle, %s: hit ratio %.1f%%, TTFT p50 / p90 / p99 %.0f / %.0f / %.0f ms\n",
			o.Name, 100*o.CacheHitRatio, o.TTFTms.P50, o.TTFTms.P90, o.TTFTms.P99)
	}
}

// sortedMs returns the samples in milliseconds, ascending.
func sortedMs(d []time.Duration) []float64 {
	out := make([]float64, len(d))
	for i, x := range d {
		out[i] = Ms(x)
	}
	sort.Float64s(out)
	return out
}
