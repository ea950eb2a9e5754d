//go:build !metricsonly

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvroute/kvroute/internal/metricsvc"
	"github.com/kvroute/kvroute/internal/metricsvc/discovery"
	"github.com/kvroute/kvroute/internal/metricsvc/push"
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
	cacheState string
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
	f.StringVar(&o.cacheState, "cache-state", "", "run the metrics service (kvroute metrics) in the demo, pushing the engines' state and merging the workers' routing reports: "+
		"approximate (no KV events: the index's capacity model) or precise (the engines publish KV events, which the service bridges into removals); empty: static endpoints, no service")
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
	if o.cacheState != "" && !slices.Contains(fleet.CacheStates, o.cacheState) {
		return fmt.Errorf("--cache-state %q: want one of %s, or empty", o.cacheState, strings.Join(fleet.CacheStates, ", "))
	}
	w, err := demoWorkload(o.seed, o.scale)
	if err != nil {
		return err
	}
	prof, _ := sim.LookupProfile("")
	prof.NumGPUBlocksOverride = o.kvBlocks
	report := &report.Report{
		Trace: w.Name, Replicas: o.replicas, Profile: prof.Name, RateScale: o.scale, Seed: o.seed, Mode: "live", CacheState: o.cacheState,
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
		res, err := demoStrategy(ctx, name, module, w, o, stderr)
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
func demoStrategy(ctx context.Context, name string, module []byte, w *workload.Workload, o demoOptions, stderr io.Writer) (report.Result, error) {
	engines, err := server.Start(server.Options{Replicas: o.replicas, TimeScale: o.timeScale, KVBlocks: o.kvBlocks, KVEvents: o.cacheState == "precise"})
	if err != nil {
		return report.Result{}, err
	}
	defer engines.Close()
	addrs := engines.Addrs()
	var eps []string
	for _, a := range addrs {
		eps = append(eps, fmt.Sprintf(`{"address":%q}`, a))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return report.Result{}, err
	}
	defer ln.Close()
	clusters := map[string][]string{"engines": addrs}
	state := ""
	var svc *demoMetrics
	if o.cacheState != "" {
		svc, err = startDemoMetrics(ctx, engines, "http://"+ln.Addr().String()+"/.kvroute/v1/state")
		if err != nil {
			return report.Result{}, err
		}
		defer svc.stop()
		clusters["kvroute_metrics"] = []string{svc.addr}
		state = fmt.Sprintf(`,"state":{"token":%q,"report":{"cluster":"kvroute_metrics"}}`, demoToken)
	}
	cfg := fmt.Sprintf(`{"endpoints":[%s],"strategy":%q,"fallbacks":1,"orca":true%s}`, strings.Join(eps, ","), name, state)
	host, err := wasmhost.New(ctx, wasmhost.Config{
		Module: module, VMID: "kvroute", Workers: 2,
		Filters:      []wasmhost.Filter{{RootID: "kvroute.router", Configuration: cfg, AllowOnHeadersStopIteration: true}},
		Clusters:     clusters,
		RouteCluster: "engines",
		RouteTimeout: -1,
	})
	if err != nil {
		return report.Result{}, err
	}
	defer host.Close()
	go host.Serve(ln)
	if o.cacheState != "" {
		// The service's first push (its engines scraped, their KV event
		// subscriptions up) before the first request.
		deadline := time.Now().Add(10 * time.Second)
		for host.CounterValue("kvroute.router.state.pushes") == 0 {
			if time.Now().After(deadline) {
				return report.Result{}, errors.New("the in-process metrics service pushed nothing in 10 s")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	t0 := time.Now()
	// Chat users send their conversation id in the filter's default session
	// header, as chat front ends do.
	recs, err := replay.Run(ctx, w, replay.Options{BaseURL: "http://" + ln.Addr().String(), TimeScale: o.timeScale, SessionHeader: "x-session-id"})
	if err != nil {
		return report.Result{}, err
	}
	wall := time.Since(t0)
	if o.cacheState != "" {
		st := svc.svc.Snapshot()
		precise := 0
		for _, h := range st.Hosts {
			if h.PreciseCacheState {
				precise++
			}
		}
		fmt.Fprintf(stderr, "  metrics service: %d state pushes taken, %d removals applied, %d of %d engines with precise cache state at the end; "+
			"cached tokens predicted %d, confirmed %d (%d responses over-predicted, %d under)\n",
			host.CounterValue("kvroute.router.state.pushes"), host.CounterValue("kvroute.router.state.removals_applied"), precise, len(st.Hosts),
			host.CounterValue("kvroute.router.feedback.predicted_cached_tokens"), host.CounterValue("kvroute.router.confirmed_cached_tokens"),
			host.CounterValue("kvroute.router.feedback.over_predicted"), host.CounterValue("kvroute.router.feedback.under_predicted"))
	}

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
	// The router's own figure (docs/cache-state.md): block-weighted
	// |predicted - confirmed| cached tokens over confirmed, across workers.
	if c := host.CounterValue("kvroute.router.confirmed_cached_tokens"); c > 0 {
		pe := float64(host.CounterValue("kvroute.router.feedback.prediction_error_tokens")) / float64(c)
		res.PredictionError = &pe
	}
	return res, nil
}

// demoToken is the state token the demo's metrics service and filter share.
const demoToken = "kvroute-demo"

// demoMetrics is `kvroute metrics` run in the demo's process.
type demoMetrics struct {
	svc  *metricsvc.Service
	addr string
	stop func()
}

// startDemoMetrics runs the metrics service over the demo's engines,
// pushing to gateway (the Wasm host's state URL) and taking its workers'
// reports; it follows the engines' KV events when they publish them.
func startDemoMetrics(ctx context.Context, engines *server.Fleet, gateway string) (*demoMetrics, error) {
	var src discovery.Fixed
	for _, s := range engines.Servers {
		src = append(src, discovery.Endpoint{Address: s.Addr, KVEvents: s.KVEventsEndpoint})
	}
	svc, err := metricsvc.New(metricsvc.Config{
		Source: src, Gateways: []string{gateway}, Token: push.StaticToken(demoToken), Name: "demo",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); svc.Run(ctx) }()
	srv := &http.Server{Handler: svc.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return &demoMetrics{svc: svc, addr: ln.Addr().String(), stop: func() {
		srv.Close()
		cancel()
		<-done
	}}, nil
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
