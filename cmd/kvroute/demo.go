//go:build !metricsonly

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/fleet"
	"github.com/kvroute/kvroute/internal/sim/replay"
	"github.com/kvroute/kvroute/internal/sim/report"
	"github.com/kvroute/kvroute/internal/sim/server"
	"github.com/kvroute/kvroute/internal/sim/wasmhost"
	"github.com/kvroute/kvroute/internal/sim/workload"
)

type demoOptions struct {
	wasm       string
	replicas   int
	strategies string
	out        string
	timeScale  float64
	kvBlocks   int
	seed       uint64
	scale      float64
}

func init() {
	var o demoOptions
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Route a short workload through the Wasm filter to simulated engines; compare strategies",
		Long: `demo is the end-to-end run: for each strategy it starts simulated vLLM
engines on loopback (kvroute sim), loads dist/kvroute.wasm into the
Envoy-like Wasm host with the kvroute.router filter set to that strategy,
replays a workload of shared system prompts and multi-turn chats through it
over real HTTP (streamed, with usage), and measures what the clients saw. It
prints the comparison, writes the bench-contract JSON and a PNG next to it.

The engines' KV cache is kept small (--kv-blocks) so that, as in production
with long contexts, the fleet cannot hold every prefix everywhere and where a
request lands decides whether it hits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), o, cmd.OutOrStdout(), os.Stderr)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.wasm, "wasm", "dist/kvroute.wasm", "the filter module (make wasm)")
	f.IntVar(&o.replicas, "replicas", 4, "simulated engines")
	f.StringVar(&o.strategies, "strategies", "round_robin,kv_cache_aware", "strategies to compare")
	f.StringVar(&o.out, "out", "dist/demo.json", "results (bench-contract JSON); the plot goes next to it")
	f.Float64Var(&o.timeScale, "time-scale", 1, "wall seconds per simulated second (engines and arrivals)")
	f.IntVar(&o.kvBlocks, "kv-blocks", 5000, "KV capacity per engine in 16-token blocks (80k tokens)")
	f.Uint64Var(&o.seed, "seed", 1, "workload seed")
	f.Float64Var(&o.scale, "load", 2, "request rate multiplier")
	addCommand(cmd)
}

// demoWorkload is 408 requests (about 15 s at load 2): 12 teams each with
// its own 6,000-token system prompt (24 questions each), and 24 users in
// 5-turn chats with a 2,000-token system prompt of their own, interleaved.
// Its working set (about 150k tokens) fits the fleet's KV (4 x 80k) but not
// one engine's: round robin makes every engine cache everything and thrash.
func demoWorkload(seed uint64, load float64) (*workload.Workload, error) {
	sp, err := workload.SharedPrefix{Groups: 12, PromptsPerGroup: 24, SystemTokens: 6000, QuestionTokens: 150,
		OutputTokens: 48, Rate: 14, Seed: seed}.Generate()
	if err != nil {
		return nil, err
	}
	mt, err := workload.MultiTurn{Users: 24, Rounds: 5, SystemTokens: 2000, QuestionTokens: 200, OutputTokens: 64,
		Rate: 1.5, ThinkTime: 3 * time.Second, Seed: seed + 1}.Generate()
	if err != nil {
		return nil, err
	}
	w := &workload.Workload{Name: "demo: shared system prompts + multi-turn chat"}
	w.Requests = append(append(w.Requests, sp.Requests...), mt.Requests...)
	sort.SliceStable(w.Requests, func(i, j int) bool { return w.Requests[i].Arrival < w.Requests[j].Arrival })
	for i := range w.Requests {
		w.Requests[i].ID = i
	}
	w.Scale(load)
	return w, nil
}

func runDemo(ctx context.Context, o demoOptions, stdout, stderr io.Writer) error {
	if ctx == nil {
		ctx = context.Background()
	}
	module, err := os.ReadFile(o.wasm)
	if err != nil {
		return fmt.Errorf("read the filter module: %w (build it with `make wasm`)", err)
	}
	if o.replicas < 1 || o.timeScale <= 0 || o.kvBlocks < 1 || o.scale <= 0 {
		return errors.New("--replicas, --time-scale, --kv-blocks and --load must be positive")
	}
	w, err := demoWorkload(o.seed, o.scale)
	if err != nil {
		return err
	}
	prof, _ := sim.LookupProfile("")
	prof.NumGPUBlocksOverride = o.kvBlocks
	report := &report.Report{
		Trace: w.Name, Replicas: o.replicas, Profile: prof.Name, RateScale: o.scale, Seed: o.seed, Mode: "live",
		CeilingHitRatio: fleet.Ceiling(w, prof, o.replicas),
	}
	last := w.Requests[len(w.Requests)-1].Arrival
	fmt.Fprintf(stdout, "kvroute demo: %d requests (%s) over %.0f s per strategy, %d simulated %s engines with %d KV tokens each, through %s in the Wasm host\n\n",
		len(w.Requests), w.Name, last.Seconds()*o.timeScale, o.replicas, prof.Name, o.kvBlocks*prof.BlockSize, o.wasm)

	for _, name := range strings.Split(o.strategies, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		fmt.Fprintf(stderr, "running %s ...\n", name)
		res, err := demoStrategy(ctx, name, module, w, o)
		if err != nil {
			return fmt.Errorf("strategy %s: %w", name, err)
		}
		report.Results = append(report.Results, res)
	}
	if len(report.Results) == 0 {
		return errors.New("--strategies is empty")
	}
	if dir := filepath.Dir(o.out); dir != "" {
		os.MkdirAll(dir, 0o755)
	}
	if err := report.WriteJSON(o.out); err != nil {
		return err
	}
	png := strings.TrimSuffix(o.out, filepath.Ext(o.out)) + ".png"
	if err := report.WritePNG(png); err != nil {
		return err
	}
	report.Markdown(stdout)
	if len(report.Results) >= 2 {
		a, b := report.Results[0], report.Results[len(report.Results)-1]
		if a.TTFTms.P50 > 0 {
			fmt.Fprintf(stdout, "\n%s vs %s: cached prompt tokens %.1f%% -> %.1f%%, median TTFT %.0f ms -> %.0f ms (%.1fx)\n",
				a.Strategy, b.Strategy, 100*a.CacheHitRatio, 100*b.CacheHitRatio, a.TTFTms.P50, b.TTFTms.P50, a.TTFTms.P50/max(b.TTFTms.P50, 1e-9))
		}
	}
	fmt.Fprintf(stdout, "\nwrote %s and %s\n", o.out, png)
	return nil
}

// demoStrategy runs the workload once: fresh engines (cold caches), a fresh
// Wasm host with the filter set to the strategy, the replay, the figures.
func demoStrategy(ctx context.Context, name string, module []byte, w *workload.Workload, o demoOptions) (report.Result, error) {
	engines, err := server.Start(server.Options{Replicas: o.replicas, TimeScale: o.timeScale, KVBlocks: o.kvBlocks})
	if err != nil {
		return report.Result{}, err
	}
	defer engines.Close()
	addrs := engines.Addrs()
	var eps []string
	for _, a := range addrs {
		eps = append(eps, fmt.Sprintf(`{"address":%q}`, a))
	}
	cfg := fmt.Sprintf(`{"endpoints":[%s],"strategy":%q,"fallbacks":1,"orca":true}`, strings.Join(eps, ","), name)
	host, err := wasmhost.New(ctx, wasmhost.Config{
		Module: module, VMID: "kvroute", Workers: 2,
		Filters:      []wasmhost.Filter{{RootID: "kvroute.router", Configuration: cfg, AllowOnHeadersStopIteration: true}},
		Clusters:     map[string][]string{"engines": addrs},
		RouteCluster: "engines",
		RouteTimeout: -1,
	})
	if err != nil {
		return report.Result{}, err
	}
	defer host.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return report.Result{}, err
	}
	go host.Serve(ln)
	defer ln.Close()

	t0 := time.Now()
	// Chat users send their conversation id in the filter's default session
	// header, as chat front ends do.
	recs, err := replay.Run(ctx, w, replay.Options{BaseURL: "http://" + ln.Addr().String(), TimeScale: o.timeScale, SessionHeader: "x-session-id"})
	if err != nil {
		return report.Result{}, err
	}
	wall := time.Since(t0)

	var ttft, tpot, e2e []time.Duration
	var cached, input, output int64
	failed := 0
	for _, r := range recs {
		if r.Err != "" {
			failed++
			continue
		}
		ttft, e2e = append(ttft, scaleBack(r.TTFT, o.timeScale)), append(e2e, scaleBack(r.E2E, o.timeScale))
		if r.TPOT > 0 {
			tpot = append(tpot, scaleBack(r.TPOT, o.timeScale))
		}
		cached += int64(r.CachedTokens)
		input += int64(r.PromptTokens)
		output += int64(r.OutputTokens)
	}
	if failed > 0 {
		for _, r := range recs {
			if r.Err != "" {
				return report.Result{}, fmt.Errorf("%d of %d requests failed, first: %s", failed, len(recs), r.Err)
			}
		}
	}
	busy := make([]time.Duration, len(engines.Servers))
	for i, s := range engines.Servers {
		busy[i] = s.Stats().Busy
	}
	var decision []time.Duration
	if m, ok := host.Metric("kvroute.router.decision_us"); ok {
		for _, us := range m.Samples {
			decision = append(decision, time.Duration(us)*time.Microsecond)
		}
	}
	p := func(d []time.Duration, q float64) float64 { return report.Ms(pct(d, q)) }
	res := report.Result{
		Strategy:      name,
		Requests:      len(recs),
		TTFTms:        report.P50P90P99{P50: p(ttft, 0.5), P90: p(ttft, 0.9), P99: p(ttft, 0.99)},
		TPOTms:        report.P50P90{P50: p(tpot, 0.5), P90: p(tpot, 0.9)},
		E2Ems:         report.P50P99{P50: p(e2e, 0.5), P99: p(e2e, 0.99)},
		OutputTokPerS: float64(output) / scaleBack(wall, o.timeScale).Seconds(),
		LoadImbalance: fleet.Imbalance(busy),
		RouterUS:      report.P50P99{P50: report.Us(pct(decision, 0.5)), P99: report.Us(pct(decision, 0.99))},
		TTFTSamples:   ttft,
	}
	if input > 0 {
		res.CacheHitRatio = float64(cached) / float64(input)
	}
	return res, nil
}

// scaleBack converts a wall duration to simulated time.
func scaleBack(d time.Duration, scale float64) time.Duration {
	return time.Duration(float64(d) / scale)
}

// pct is the nearest-rank quantile (0 for no data).
func pct(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}
