//go:build !metricsonly

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/fleet"
	"github.com/kvroute/kvroute/internal/sim/report"
	"github.com/kvroute/kvroute/internal/sim/workload"
)

type benchOptions struct {
	trace      string
	workload   string
	replicas   int
	strategies string
	out        string
	rateScale  float64
	seed       uint64
	profile    string
	limit      int
	parallel   int
	config     string
	sessions   bool
	noCorrect  bool
	noCapacity bool
	capScale   float64
	cacheState string
	top        fleet.Topology
	spread     string
	reports    bool
	adapters   int
	maxLoRAs   int
	loraLoad   time.Duration
	dpRanks    int
	dpRouting  string
}

func init() {
	var o benchOptions
	cmd := &cobra.Command{
		Use:   "bench --trace FILE [--replicas N] [--strategies a,b,...] [--out FILE.json]",
		Short: "Compare routing strategies on a simulated fleet replaying a Mooncake trace",
		Long: `bench replays a Mooncake JSONL trace through a fleet of simulated vLLM-like
engines in virtual time, once per strategy, with the real routing code deciding.
It writes the bench contract's JSON (docs/simulator.md, "The bench contract"),
a PNG next to it (TTFT CDF per strategy, hit ratio per strategy against the
fleet's ceiling) and prints a markdown table. The folder of --out is created
if missing.

Instead of a trace, --workload runs one of the built-in generators:
` + strings.Join(benchWorkloadNames(), ", ") + ` (docs/simulator.md).

Strategies: ` + strings.Join(fleet.StrategyNames, ", ") + `.
Profiles: ` + strings.Join(sim.ProfileNames(), ", ") + `.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBench(o, cmd.OutOrStdout(), os.Stderr)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.trace, "trace", "", "Mooncake JSONL trace (required unless --workload)")
	f.StringVar(&o.workload, "workload", "", "built-in generated workload instead of a trace: "+strings.Join(benchWorkloadNames(), ", "))
	f.IntVar(&o.replicas, "replicas", 8, "number of engine replicas")
	f.StringVar(&o.strategies, "strategies", strings.Join(fleet.StrategyNames, ","), "comma-separated strategies to compare")
	f.StringVar(&o.out, "out", "bench.json", "results file (JSON); the plot is written next to it as .png")
	f.Float64Var(&o.rateScale, "rate-scale", 1, "request rate multiplier: arrival times are divided by it")
	f.Uint64Var(&o.seed, "seed", 1, "seed for every random choice (routers, tie-breaks)")
	f.StringVar(&o.profile, "profile", sim.DefaultProfile, "engine cost profile; a comma list mixes them, replica i running the (i mod n)th")
	f.IntVar(&o.limit, "limit", 0, "replay only the first N requests (0: all)")
	f.IntVar(&o.parallel, "parallel", 0, "strategies simulated at once (0: one per CPU)")
	f.BoolVar(&o.sessions, "trace-sessions", false, "give trace requests a session id derived from their first hash id (the trace has none)")
	f.StringVar(&o.cacheState, "cache-state", "approximate", "how routers learn the engines' caches: approximate (their own routing and the engines' cached_tokens) or precise (the engines' KV events too, bridged by the metrics service)")
	f.BoolVar(&o.noCorrect, "no-correct", false, "do not correct the index when an engine confirms fewer cached tokens than predicted")
	f.BoolVar(&o.noCapacity, "no-capacity", false, "the index does not know the engines' KV capacity (a gateway without the metrics service's push)")
	f.Float64Var(&o.capScale, "index-capacity-scale", 1, "multiply the KV capacity the index ages blocks out at (the engines' own, as pushed) by this, in [0.5, 4]; peers' own index sizes are kept")
	f.IntVar(&o.top.Gateways, "gateways", 1, "gateway replicas behind the load balancer (docs/topology.md)")
	f.IntVar(&o.top.Workers, "workers", 1, "Envoy workers per gateway, each its own Wasm VM sharing the gateway's shared data")
	f.StringVar(&o.spread, "spread", "random", "how connections reach gateways and workers: random (a cloud load balancer, SO_REUSEPORT) or round_robin")
	f.DurationVar(&o.top.PushDelay, "push-delay", 0, "time from the metrics service's scrape to its push reaching the gateways")
	f.DurationVar(&o.top.ReportInterval, "report-interval", 50*time.Millisecond, "how often each gateway reports its routing to the metrics service")
	f.DurationVar(&o.top.ReportDelay, "report-delay", 20*time.Millisecond, "time from a gateway's report to the other gateways applying the merged push")
	f.BoolVar(&o.reports, "gateway-reports", true, "gateways report their routing and load through the metrics service (false: each gateway knows only its own traffic)")
	f.StringVar(&o.config, "config", "", "plugin configuration JSON (as given to the filter) defining extra profiles to bench by name")
	f.IntVar(&o.adapters, "adapters", 0, "LoRA adapters the requests name (0: none): each conversation runs one, popular ones more often (docs/simulator.md)")
	f.IntVar(&o.maxLoRAs, "max-loras", 4, "with --adapters: adapters each engine batches at once (vLLM's --max-loras)")
	f.DurationVar(&o.loraLoad, "lora-load", 50*time.Millisecond, "with --adapters: time an engine step takes longer to bring an adapter into a GPU slot")
	f.IntVar(&o.dpRanks, "dp-ranks", 1, "data-parallel ranks per replica (vLLM --data-parallel-size): each rank an engine with its own KV cache")
	f.StringVar(&o.dpRouting, "dp-routing", "rank", "with --dp-ranks: rank (the router chooses each (endpoint, rank), as kvroute does) or endpoint (the router chooses the endpoint, the engine's balancer the least-loaded rank)")
	addCommand(cmd)
}

func runBench(o benchOptions, stdout, stderr io.Writer) error {
	if (o.trace == "") == (o.workload == "") {
		return fmt.Errorf("give --trace FILE (a Mooncake JSONL trace: one {\"timestamp\", \"input_length\", \"output_length\", \"hash_ids\"} object per line) or --workload NAME (%s)", strings.Join(benchWorkloadNames(), ", "))
	}
	if o.replicas < 1 {
		return fmt.Errorf("--replicas must be at least 1, got %d", o.replicas)
	}
	if o.rateScale <= 0 {
		return fmt.Errorf("--rate-scale must be positive, got %g", o.rateScale)
	}
	if o.cacheState == "" {
		o.cacheState = "approximate"
	}
	if !slices.Contains(fleet.CacheStates, o.cacheState) {
		return fmt.Errorf("--cache-state %q: want one of %s", o.cacheState, strings.Join(fleet.CacheStates, ", "))
	}
	switch o.spread {
	case "random", "":
	case "round_robin":
		o.top.RoundRobin = true
	default:
		return fmt.Errorf("--spread %q: use random or round_robin", o.spread)
	}
	o.top.Gateways, o.top.Workers = max(o.top.Gateways, 1), max(o.top.Workers, 1)
	if o.top.Gateways > 64 || o.top.Workers > 256 {
		return fmt.Errorf("--gateways (at most 64) and --workers (at most 256): got %d and %d", o.top.Gateways, o.top.Workers)
	}
	o.dpRanks = max(o.dpRanks, 1)
	if o.dpRanks > 64 {
		return fmt.Errorf("--dp-ranks must be at most 64, got %d", o.dpRanks)
	}
	switch o.dpRouting {
	case "", "rank":
		o.dpRouting = "rank"
	case "endpoint":
		if o.top.Gateways > 1 || o.top.Workers > 1 || o.cacheState == "precise" {
			return errors.New("--dp-routing endpoint runs with one gateway and one worker and the approximate cache state")
		}
	default:
		return fmt.Errorf("--dp-routing %q: use rank or endpoint", o.dpRouting)
	}
	o.top.NoReports = !o.reports
	o.top.Seed = o.seed
	// A comma list is a heterogeneous fleet: replica i runs the
	// (i mod n)th profile.
	var mixed []sim.Profile
	for _, name := range strings.Split(o.profile, ",") {
		p, err := sim.LookupProfile(strings.TrimSpace(name))
		if err != nil {
			return err
		}
		mixed = append(mixed, p)
	}
	prof := mixed[0]
	var err error
	if o.adapters > 0 {
		if o.maxLoRAs < 1 || o.loraLoad < 0 {
			return fmt.Errorf("--adapters needs --max-loras >= 1 and --lora-load >= 0, got %d and %v", o.maxLoRAs, o.loraLoad)
		}
		for i := range mixed {
			mixed[i].MaxLoRAs, mixed[i].LoRALoadTime = o.maxLoRAs, o.loraLoad
		}
		prof = mixed[0]
	}
	var names []string
	for _, s := range strings.Split(o.strategies, ",") {
		if s = strings.TrimSpace(s); s != "" {
			names = append(names, s)
		}
	}
	if len(names) == 0 {
		return errors.New("--strategies is empty")
	}
	// Create the output folder now, not after minutes of simulation.
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return fmt.Errorf("--out %s: %w", o.out, err)
	}
	if o.capScale != 0 && !(o.capScale >= 0.5 && o.capScale <= 4) {
		return fmt.Errorf("--index-capacity-scale %v: must be in [0.5, 4] (1: the engines' own capacity)", o.capScale)
	}
	sopt := fleet.StrategyOptions{Seed: o.seed, Profile: prof, NoCorrect: o.noCorrect, NoCapacity: o.noCapacity, CapacityScale: o.capScale}
	if o.config != "" {
		if sopt.Config, err = os.ReadFile(o.config); err != nil {
			return fmt.Errorf("--config: %w", err)
		}
	}
	for _, s := range names {
		// Fail before minutes of simulation on a typo.
		if _, err := fleet.NewStrategy(s, o.replicas, sopt); err != nil {
			return err
		}
	}
	var w *workload.Workload
	source := o.trace
	if o.workload != "" {
		if w, err = benchWorkload(o.workload, o.seed); err != nil {
			return err
		}
		w.Scale(o.rateScale)
		if o.limit > 0 && o.limit < len(w.Requests) {
			w.Requests = w.Requests[:o.limit]
		}
		source = "workload:" + o.workload
	} else if w, err = workload.LoadMooncake(o.trace, workload.TraceOptions{RateScale: o.rateScale, Limit: o.limit, SessionsFromPrefix: o.sessions}); err != nil {
		return err
	}

	w.AssignAdapters(o.adapters, o.seed)
	if len(mixed) == 1 {
		mixed = nil
	} else {
		prof.Name = o.profile
	}
	report, walls, err := benchFleet(w, names, prof, mixed, o, sopt, progressBar(stderr, len(names)*len(w.Requests)))
	if err != nil {
		return err
	}
	report.Trace = source
	if err := report.WriteJSON(o.out); err != nil {
		return err
	}
	png := strings.TrimSuffix(o.out, filepath.Ext(o.out)) + ".png"
	if err := report.WritePNG(png); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d requests from %s, %d x %s, rate scale %g, seed %d, %d gateways x %d workers, %s cache state", len(w.Requests), source, o.replicas, prof.Name, o.rateScale, o.seed, o.top.Gateways, o.top.Workers, o.cacheState)
	if o.dpRanks > 1 {
		fmt.Fprintf(stdout, ", %d data-parallel ranks per replica routed per %s", o.dpRanks, o.dpRouting)
	}
	if o.adapters > 0 {
		fmt.Fprintf(stdout, ", %d LoRA adapters (%d per batch, %v to load)", o.adapters, prof.MaxLoRAs, prof.LoRALoadTime)
	}
	fmt.Fprint(stdout, "\n\n")
	report.Markdown(stdout)
	fmt.Fprintf(stdout, "\nwall time per strategy (simulating %d replicas, %d at a time):", o.replicas*o.dpRanks, parallelism(o.parallel, len(names)))
	for i, name := range names {
		fmt.Fprintf(stdout, " %s %.1fs", name, walls[i].Seconds())
	}
	fmt.Fprintf(stdout, "\nwrote %s and %s\n", o.out, png)
	return nil
}

// benchFleet simulates every strategy on the workload (in parallel, each
// with its own fleet and router) and computes the fleet's ceiling.
func benchFleet(w *workload.Workload, names []string, prof sim.Profile, mixed []sim.Profile, o benchOptions, sopt fleet.StrategyOptions, progress func(int)) (*report.Report, []time.Duration, error) {
	// Every data-parallel rank is an engine of its own.
	engines := o.replicas * max(o.dpRanks, 1)
	report := &report.Report{
		Replicas: engines, Profile: prof.Name, RateScale: o.rateScale, Seed: o.seed, Mode: "simulated", CacheState: o.cacheState,
		Gateways: o.top.Gateways, Workers: o.top.Workers,
		Results: make([]report.Result, len(names)),
	}
	par := o.parallel
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	walls := make([]time.Duration, len(names))
	sem := make(chan struct{}, par)
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	var routed atomic.Int64
	wg.Go(func() { report.CeilingHitRatio = fleet.Ceiling(w, prof, engines) })
	if len(mixed) == 0 {
		// Oracles assume one profile: a mixed fleet has no single prefill time.
		wg.Go(func() { report.Oracles = oracles(w, prof, engines) })
	}
	for i, name := range names {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			var router fleet.Router
			var err error
			switch {
			case o.dpRouting == "endpoint" && o.dpRanks > 1:
				router, err = endpointRanks(name, o, sopt)
			case o.top.Gateways == 1 && o.top.Workers == 1:
				router, err = fleet.NewStrategy(name, engines, sopt)
			default:
				router, err = fleet.NewTopology(name, engines, sopt, o.top)
			}
			if err != nil {
				errs[i] = err
				return
			}
			if o.cacheState == "precise" {
				if router, err = fleet.NewPrecise(router); err != nil {
					errs[i] = err
					return
				}
			}
			last := 0
			res, err := fleet.Run(fleet.Config{
				Replicas: engines, Profile: prof, Mixed: mixed,
				Progress: func(done, _ int) {
					if progress != nil {
						progress(int(routed.Add(int64(done - last))))
					}
					last = done
				},
			}, w, router)
			if err != nil {
				errs[i] = fmt.Errorf("strategy %s: %w", name, err)
				return
			}
			report.Results[i] = toResult(name, res)
			if len(mixed) == 0 {
				report.Results[i].UnqueuedTTFTms = unqueued(res, prof)
			}
			if st, ok := fleet.RouterStats(router); ok {
				pe := st.PredictionError()
				report.Results[i].PredictionError = &pe
			}
			walls[i] = res.Wall
		})
	}
	wg.Wait()
	if progress != nil {
		progress(-1)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	return report, walls, nil
}

// endpointRanks is strategy name routing among --replicas endpoints whose
// ranks the engines' own balancer chooses (fleet.EndpointRanks); its index
// knows each endpoint's KV capacity, every rank's together.
func endpointRanks(name string, o benchOptions, sopt fleet.StrategyOptions) (fleet.Router, error) {
	sopt.Profile.NumGPUBlocksOverride = sopt.Profile.NumGPUBlocks() * o.dpRanks
	inner, err := fleet.NewStrategy(name, o.replicas, sopt)
	if err != nil {
		return nil, err
	}
	return fleet.NewEndpointRanks(inner, o.replicas, o.dpRanks)
}

// oracles are the clairvoyant bounds of the run (fleet.RunOracle): the
// fleet's pooled cache with no queueing, and an unbounded cache with no
// queueing, whose TTFT percentiles no routing can go below.
func oracles(w *workload.Workload, prof sim.Profile, replicas int) []report.Oracle {
	var out []report.Oracle
	for _, c := range []struct {
		name     string
		replicas int
	}{{"pooled ceiling, no queueing", replicas}, {"unbounded cache, no queueing (a floor for any router)", 0}} {
		o := fleet.RunOracle(w, prof, c.replicas)
		out = append(out, report.Oracle{Name: c.name, CacheHitRatio: o.HitRatio,
			TTFTms: report.P50P90P99{P50: report.Ms(o.TTFT.P50), P90: report.Ms(o.TTFT.P90), P99: report.Ms(o.TTFT.P99)}})
	}
	return out
}

// unqueued is the run's TTFT with its own cache hits and no queueing
// (fleet.Result.UnqueuedTTFT), in the report's units.
func unqueued(res *fleet.Result, prof sim.Profile) *report.P50P90P99 {
	u := res.UnqueuedTTFT(prof)
	return &report.P50P90P99{P50: report.Ms(u.P50), P90: report.Ms(u.P90), P99: report.Ms(u.P99)}
}

func toResult(name string, res *fleet.Result) report.Result {
	s := res.Summarize()
	r := report.Result{
		Strategy:      name,
		Requests:      s.Requests,
		TTFTms:        report.P50P90P99{P50: report.Ms(s.TTFT.P50), P90: report.Ms(s.TTFT.P90), P99: report.Ms(s.TTFT.P99)},
		TPOTms:        report.P50P90{P50: report.Ms(s.TPOT.P50), P90: report.Ms(s.TPOT.P90)},
		E2Ems:         report.P50P99{P50: report.Ms(s.E2E.P50), P99: report.Ms(s.E2E.P99)},
		OutputTokPerS: s.OutputTokPerS,
		CacheHitRatio: s.HitRatio,
		LoadImbalance: s.LoadImbalance,
		RouterUS:      report.P50P99{P50: report.Us(s.RouterTime.P50), P99: report.Us(s.RouterTime.P99)},
	}
	for _, rec := range res.Records {
		if !rec.Rejected {
			r.TTFTSamples = append(r.TTFTSamples, rec.TTFT)
		}
	}
	return r
}

// progressBar returns a progress callback drawing on w when w is a
// terminal, and nil otherwise (logs, pipes and /dev/null get no control
// characters). The callback takes the number of units done; -1 finishes
// the line.
func progressBar(w io.Writer, total int) func(int) {
	f, ok := w.(*os.File)
	if !ok || total <= 0 || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	return drawProgress(f, total)
}

// drawProgress draws a bar of total units on w, redrawing at most every
// 100 ms (and always at 100%) so a fast run does not flood the terminal.
func drawProgress(w io.Writer, total int) func(int) {
	var mu sync.Mutex
	var lastDraw time.Time
	start := time.Now()
	return func(done int) {
		mu.Lock()
		defer mu.Unlock()
		if done < 0 {
			fmt.Fprintf(w, "\r%-70s\r", "")
			return
		}
		if time.Since(lastDraw) < 100*time.Millisecond && done < total {
			return
		}
		lastDraw = time.Now()
		const width = 40
		fill := width * done / total
		fmt.Fprintf(w, "\r[%s%s] %3d%% %6.1fs", strings.Repeat("#", fill), strings.Repeat(".", width-fill), 100*done/total, time.Since(start).Seconds())
	}
}

// parallelism is how many strategies run at once.
func parallelism(flag, n int) int {
	if flag <= 0 {
		flag = runtime.GOMAXPROCS(0)
	}
	return min(flag, n)
}

// benchWorkloads are the generated workloads bench can run instead of a
// trace, each a few minutes of traffic for 8 replicas of the default
// profile.
var benchWorkloads = map[string]func(seed uint64) (*workload.Workload, error){
	// 64 system prompts of 4,000 tokens, 32 questions each.
	"shared-prefix": func(seed uint64) (*workload.Workload, error) {
		return workload.SharedPrefix{Groups: 64, PromptsPerGroup: 32, SystemTokens: 4000, QuestionTokens: 200,
			OutputTokens: 100, Rate: 20, Seed: seed}.Generate()
	},
	// 200 users, 8 turns each, 10 s between turns.
	"multi-turn": func(seed uint64) (*workload.Workload, error) {
		return workload.MultiTurn{Users: 200, Rounds: 8, SystemTokens: 1000, QuestionTokens: 300,
			OutputTokens: 200, Rate: 2, ThinkTime: 10 * time.Second, Seed: seed}.Generate()
	},
	// 2,000 queries over 200 documents of 1,500 tokens, 4 per query.
	"rag": func(seed uint64) (*workload.Workload, error) {
		return workload.RAG{Queries: 2000, Documents: 200, DocsPerQuery: 4, DocTokens: 1500, SystemTokens: 500,
			QuestionTokens: 100, OutputTokens: 100, Rate: 10, Seed: seed}.Generate()
	},
	// make demo's workload.
	"demo": func(seed uint64) (*workload.Workload, error) { return demoWorkload(seed, 1) },
}

func benchWorkloadNames() []string {
	names := make([]string, 0, len(benchWorkloads))
	for n := range benchWorkloads {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func benchWorkload(name string, seed uint64) (*workload.Workload, error) {
	gen, ok := benchWorkloads[name]
	if !ok {
		return nil, fmt.Errorf("unknown workload %q (known: %s)", name, strings.Join(benchWorkloadNames(), ", "))
	}
	return gen(seed)
}
