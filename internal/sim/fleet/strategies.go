package fleet

import (
	"fmt"
	"strings"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/dispatch"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/internal/sim/workload"
	"github.com/kvroute/kvroute/scorer"
)

// StrategyNames are the bench contract's strategy names, in its order.
var StrategyNames = []string{
	"round_robin", "random", "least_request", "prefix_hash", "sticky_session",
	"kv_cache_aware", "sglang_cache_aware", "gie_default", "dynamo_kv",
}

// StrategyOptions tunes how a strategy is assembled.
type StrategyOptions struct {
	// Seed seeds the decision randomness.
	Seed uint64
	// Profile is the engine profile: the index's per-host capacity mirrors
	// its KV capacity, as the pushed vllm:cache_config_info would set it.
	Profile sim.Profile
	// Config, when set, is a plugin configuration JSON (as given to the
	// Envoy filter) whose "strategy", "plugins" and "profiles" are used;
	// the strategy name then selects among its profiles and the presets.
	Config []byte
	// NoCorrect leaves the index uncorrected by the engines' cached_tokens
	// (router.Config.NoCorrect).
	NoCorrect bool
	// NoCapacity leaves the index without the engines' KV capacity, as a
	// gateway without the metrics service's push has it: nothing ages out
	// but what cached_tokens corrects.
	NoCapacity bool
	// CapacityScale, when above 0, multiplies the KV capacity the index
	// is given (not a peer's own index size): an index that believes each
	// engine holds that much more before it ages blocks out. 0 is 1.
	CapacityScale float64
}

// NewStrategy returns a router for a bench strategy over n replicas. Every
// strategy, baselines included, runs through dispatch with the real
// index over an in-memory Store with Envoy's CAS rules: the code the Envoy
// filter runs, clocked by the simulation.
func NewStrategy(name string, n int, opt StrategyOptions) (Router, error) {
	store := &index.MemStore{}
	r, err := newRealRouter(name, n, opt, store, store)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// newRealRouter is NewStrategy over a given shared-data store: the workers
// of one simulated gateway each get their own router (their own VM) over
// the gateway's one store. shared is where session pins and prefix memory
// live (nil: in the router itself, per VM).
func newRealRouter(name string, n int, opt StrategyOptions, store, shared index.Store) (*RealRouter, error) {
	var h *scorer.Handler
	var err error
	if opt.Config != nil {
		cfg, perr := config.Parse(opt.Config)
		if perr != nil {
			return nil, perr
		}
		cfg.Strategy = name
		h, _, err = scorer.Build(cfg)
	} else {
		h, err = scorer.NewHandler(name)
	}
	if err != nil {
		return nil, fmt.Errorf("strategy %q: %w (bench strategies: %s)", name, err, strings.Join(StrategyNames, ", "))
	}
	a := &RealRouter{latency: make([]float64, n)}
	icfg := index.Config{Now: func() int64 { return a.nowMs }}
	capTokens := opt.Profile.NumGPUBlocks() * opt.Profile.BlockSize
	if opt.CapacityScale > 0 {
		capTokens = int(float64(capTokens) * opt.CapacityScale)
	}
	if hint := h.Decode.Index; hint != nil {
		// A peer emulation that describes its own index (gie_default: 64
		// character blocks, a fixed LRU size per pod).
		icfg.Hash.BlockChars = hint.BlockChars
		icfg.Hash.LevelBlocks = -1
		if hint.CapacityBlocksPerHost > 0 {
			capTokens = hint.CapacityBlocksPerHost * hint.BlockChars / sim.CharsPerToken
		}
	}
	if capTokens > 0 {
		// Enough shards for the fleet's capacity in level-0 blocks.
		bc := icfg.Hash.BlockChars
		if bc == 0 {
			bc = index.DefaultBlockChars
		}
		icfg.Shards = index.SuggestShards(n*capTokens*sim.CharsPerToken/bc, 0)
	}
	ix, err := index.New(store, icfg)
	if err != nil {
		return nil, err
	}
	a.ix = ix
	a.hasher = index.NewHasher(ix.Config().Hash)
	// Session pins and prefix memory in shared data, as the filter keeps
	// them: one table per gateway whatever its worker count.
	a.r = dispatch.New(dispatch.Config{Handler: h, Index: ix, Seed: max(opt.Seed, 1), Shared: shared, NoCorrect: opt.NoCorrect})
	a.hosts = make([]scorer.Host, n)
	for i := range a.hosts {
		if err := a.r.Register(fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1), &a.hosts[i]); err != nil {
			return nil, err
		}
		if capTokens > 0 && !opt.NoCapacity {
			a.capTokens = capTokens
			if err := ix.SetCapacity(index.HostRef{Slot: a.hosts[i].Slot, Gen: a.hosts[i].Gen}, capTokens); err != nil {
				return nil, err
			}
		}
	}
	return a, nil
}

// RealRouter drives dispatch as the Envoy filter does: hash the
// prompt, Decide, FirstToken when the first byte of the response arrives,
// Feedback with the engine's cached_tokens and Release at stream end. Pushed
// engine state (queue, KV use, cached blocks) arrives through ObserveState
// at the metrics service's push interval.
type RealRouter struct {
	r      *dispatch.Dispatcher
	ix     *index.Index
	hasher *index.Hasher
	hosts  []scorer.Host
	// capTokens is the engines' KV capacity the index ages blocks by (0:
	// none, NoCapacity).
	capTokens int
	tickets   map[int]*dispatch.Ticket
	latency   []float64
	nowMs     int64
	// FailedOpen counts decisions with no candidate, routed to replica 0.
	FailedOpen int
	// onRoute, when set, is told each decision's host and block chain
	// (the gateway's report to the metrics service, topology.go).
	onRoute func(replica int, chain []uint64)
}

// input hashes the request's prompt the way the filter does and builds the
// router's input for it; now becomes the router's clock.
func (a *RealRouter) input(wr *workload.Request, prompt string, now time.Duration) *dispatch.Input {
	a.nowMs = now.Milliseconds()
	a.hasher.Reset(wr.Model, wr.Adapter, "")
	if wr.Chat() {
		for _, m := range wr.Messages {
			a.hasher.Message(m.Role, m.Content)
		}
	} else {
		a.hasher.Text(prompt)
	}
	in := &dispatch.Input{
		Model: wr.Model, Adapter: wr.Adapter, SessionKey: wr.Session,
		PromptTokens: wr.PromptTokens, MaxTokens: wr.OutputTokens,
		Chain: a.hasher.Blocks(), Tokens: a.hasher, PromptChars: a.hasher.Len(),
	}
	return in
}

// Route implements Router.
func (a *RealRouter) Route(wr *workload.Request, prompt string, now time.Duration) int {
	in := a.input(wr, prompt, now)
	t, _ := a.r.Decide(in, a.hosts)
	if t.Host < 0 {
		a.FailedOpen++
		return 0
	}
	if a.tickets == nil {
		a.tickets = map[int]*dispatch.Ticket{}
	}
	a.tickets[wr.ID] = &t
	if a.onRoute != nil {
		a.onRoute(t.Host, in.Chain)
	}
	return t.Host
}

// FirstToken implements FirstTokenObserver; it also feeds the per-host
// time-to-first-byte EWMA the latency scorer reads.
func (a *RealRouter) FirstToken(wr *workload.Request, replica int, now time.Duration) {
	a.nowMs = now.Milliseconds()
	ms := float64(now-wr.Arrival) / float64(time.Millisecond)
	if t := a.tickets[wr.ID]; t != nil {
		t.TTFTMs = ms // decided at arrival: the router's own clock would read the same
		a.r.FirstToken(t)
	}
	if a.latency[replica] == 0 {
		a.latency[replica] = ms
	} else {
		a.latency[replica] += 0.2 * (ms - a.latency[replica])
	}
	a.hosts[replica].LatencyEWMAMs = a.latency[replica]
}

// Done implements DoneObserver.
func (a *RealRouter) Done(wr *workload.Request, _ int, cached int, now time.Duration) {
	a.nowMs = now.Milliseconds()
	if t := a.tickets[wr.ID]; t != nil {
		if t.SampleUsage() {
			t.EnginePromptTokens = wr.PromptTokens // the engine's usage.prompt_tokens
		}
		a.r.Feedback(t, cached)
		a.r.Release(t)
		delete(a.tickets, wr.ID)
	}
}

// ObserveState implements StateObserver: the cluster-metrics service's push.
func (a *RealRouter) ObserveState(st []sim.Stats, now time.Duration) {
	a.nowMs = now.Milliseconds()
	for i := range a.hosts {
		h := &a.hosts[i]
		h.Waiting, h.Running, h.KVUsage = st[i].Waiting, st[i].Running, st[i].KVUsage
		h.IndexedBlocks = st[i].CachedBlocks
		// vllm:lora_requests_info as the metrics service pushes it.
		h.Adapters, h.MaxAdapters, h.AdapterSlotsUsed = st[i].Adapters, st[i].MaxLoRAs, len(st[i].Adapters)
	}
}

// Stats returns the router's counters (decisions, predicted and confirmed
// cached tokens).
func (a *RealRouter) Stats() dispatch.Stats { return a.r.Stats() }
