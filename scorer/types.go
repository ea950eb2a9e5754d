package scorer

import (
	"math/rand/v2"

	"github.com/kvroute/kvroute/snapshot"
)

// Role is what part of inference a host serves.
type Role uint8

const (
	// RoleBoth is an aggregated engine: it prefills and decodes. The zero value.
	RoleBoth Role = iota
	// RolePrefill hosts compute prompts and hand the KV cache over.
	RolePrefill
	// RoleDecode hosts receive transferred KV cache and generate.
	RoleDecode
)

// ParseRole reads a role as the snapshot and the configuration spell it
// (snapshot.CheckRole): "prefill", "decode", "both" and "" (both).
func ParseRole(s string) (Role, error) {
	s, err := snapshot.CheckRole(s)
	switch s {
	case snapshot.RolePrefill:
		return RolePrefill, nil
	case snapshot.RoleDecode:
		return RoleDecode, nil
	}
	return RoleBoth, err
}

func (r Role) String() string {
	switch r {
	case RolePrefill:
		return snapshot.RolePrefill
	case RoleDecode:
		return snapshot.RoleDecode
	}
	return snapshot.RoleBoth
}

// Serves reports whether a host of role r can do work of role want.
// An aggregated host serves every role.
func (r Role) Serves(want Role) bool { return r == RoleBoth || want == RoleBoth || r == want }

// Host is the router's view of one candidate engine for one decision. The
// caller fills a []Host (reusing it between decisions); plugins refer to a
// host by its position in that slice.
type Host struct {
	// Address is host:port as Envoy's override_host policy sees it.
	Address string
	// ID is a stable 64-bit hash of Address used by consistent hashing. Zero
	// means "not computed": plugins then hash Address themselves, which costs
	// a few nanoseconds per host per decision. Callers should fill it once.
	ID uint64
	// Slot is the host's slot in the index's slot table, or -1; Gen is the
	// slot's generation (index.HostRef), carried so that the router's
	// writes cannot land on a host that replaced this one.
	Slot int
	Gen  uint32
	// Role, Model and Adapters describe what the engine serves. Adapters
	// lists LoRA adapters loaded now; MaxAdapters is how many it can hold at
	// once (0: unknown, assume a free one can be loaded) and
	// AdapterSlotsUsed how many of those are taken (vLLM's running and
	// waiting adapters, SGLang's lora_pool_slots_used). When
	// AdapterSlotsUsed is 0 the count of Adapters stands for it.
	Role             Role
	Model            string
	Adapters         []string
	MaxAdapters      int
	AdapterSlotsUsed int

	// BreakerOpen is the gateway's own circuit breaker for this host.
	BreakerOpen bool
	// Unhealthy is set when the pushed state says the engine stopped
	// answering scrapes.
	Unhealthy bool
	// Stale is set when pushed state exists but is older than the staleness
	// bound: Waiting, Running and KVUsage are then not to be trusted. Hosts
	// that never had pushed state (static endpoints) are not stale; their
	// pushed fields are simply zero.
	Stale bool

	// Pushed load, as the engine last reported it (snapshot or ORCA).
	Waiting int
	Running int
	KVUsage float64 // fraction of KV blocks in use, 0..1

	// The gateway's own accounting, exact and fresh: requests dispatched and
	// not finished, prompt tokens dispatched and not yet prefilled (as far as
	// the gateway can tell: uncached tokens of requests without a first
	// byte), and decode tokens outstanding (max tokens of requests in flight).
	InFlight             int
	PendingPrefillTokens int64
	PendingDecodeTokens  int64
	// InFlightTokens is the KV footprint of the requests in flight as the
	// gateway knows them: prompt tokens plus max tokens of each. Dynamo's
	// "active blocks" is the same quantity in blocks.
	InFlightTokens int64
	// RemoteInFlight, RemotePrefillTokens and RemoteDecodeTokens carry
	// the other gateways' share of the same counts, as their reports
	// merged by the metrics service last said, and LoadMirror is how many
	// gateways report (docs/topology.md). The router estimates each count
	// as LoadMirror x own + Remote (at least own): what changed since the
	// last report is assumed to have changed alike on every gateway, and
	// Remote is the reported total less LoadMirror x the own count at the
	// report (so it may be negative). Several gateways then see each
	// other's requests without herding on one stale picture. Zero (and
	// LoadMirror 0) with one gateway or without reports.
	RemoteInFlight                          int
	RemotePrefillTokens, RemoteDecodeTokens int64
	LoadMirror                              int

	// LatencyEWMAMs is an exponentially weighted mean of time to first byte
	// in milliseconds; 0 means no sample yet.
	LatencyEWMAMs float64
	// TTFTBaseMs and TTFTMsPerToken are the host's learned time-to-first-
	// token model (predicted_ttft): TTFT = base + per-token x work, work in
	// prefill_cost's tokens. The router fills them for profiles that read
	// them (Handler.ReadsTTFT); 0 per-token means no model.
	TTFTBaseMs, TTFTMsPerToken float64

	// BlockCapacity is the host's KV capacity in index blocks (0: unknown);
	// IndexedBlocks is how many blocks the index currently attributes to it.
	BlockCapacity int
	IndexedBlocks int

	// PreciseCache is set when the index's entries for this host follow
	// the engine's own KV events (precise cache state, bridged by the
	// metrics service): what it matches is what the engine holds, kept old
	// prefixes included, rather than a guess from routing. Scope: the
	// gateway (every worker sees the same pushed flag).
	PreciseCache bool
}

// Request is the typed per-request state plugins read. It never holds prompt
// text: only sizes, hashes and what the index matched. The per-candidate
// slices are indexed like the []Host of the same decision.
type Request struct {
	Model   string
	Adapter string // LoRA adapter requested ("" for the base model)
	// SessionKey identifies a conversation (from a configurable header or
	// the body's user field); "" when absent.
	SessionKey string
	// PinnedAddress is the host the session table holds for SessionKey
	// ("" when none). The session-affinity scorer prefers it.
	PinnedAddress string
	// PrefixAddress is the host that last served a request with the same
	// PrefixHash, as the router remembers it ("" when none). The
	// prefix-memory scorer prefers it.
	PrefixAddress string

	PromptTokens int // estimated prompt tokens
	MaxTokens    int // requested output tokens (0: unknown)

	// PrefixHash is a hash of the prompt's leading blocks, the key of
	// consistent hashing (prefix_hash strategy). Zero means "no prefix".
	PrefixHash uint64
	// TotalBlocks is the number of blocks in the request's hash chain.
	TotalBlocks int

	// MatchedBlocks and MatchedTokens hold, for each candidate, the longest
	// prefix of the chain the index believes that host holds. nil means the
	// index was not consulted (all zero).
	MatchedBlocks []int32
	MatchedTokens []int32
}

// Reset clears r for reuse and sizes the per-candidate slices to n zeroed
// entries, keeping their capacity.
func (r *Request) Reset(n int) {
	mb, mt := r.MatchedBlocks, r.MatchedTokens
	*r = Request{MatchedBlocks: resizeInt32(mb, n), MatchedTokens: resizeInt32(mt, n)}
}

func resizeInt32(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// Matched returns the matched blocks and tokens for host position i.
func (r *Request) Matched(i int) (blocks, tokens int) {
	if i < len(r.MatchedBlocks) {
		blocks = int(r.MatchedBlocks[i])
	}
	if i < len(r.MatchedTokens) {
		tokens = int(r.MatchedTokens[i])
	}
	return blocks, tokens
}

// Uncached estimates the prompt tokens host i would have to prefill.
func (r *Request) Uncached(i int) int {
	_, t := r.Matched(i)
	if u := r.PromptTokens - t; u > 0 {
		return u
	}
	return 0
}

// Category says what a scorer optimises; validation uses it to refuse the
// hotspot recipe.
type Category uint8

const (
	// Affinity scorers send like to like (prefix cache, session, LoRA).
	Affinity Category = iota + 1
	// Distribution scorers spread requests (queue, in-flight, pending tokens).
	Distribution
	// Balance scorers protect a scarce resource (KV memory, latency).
	Balance
)

func (c Category) String() string {
	switch c {
	case Affinity:
		return "affinity"
	case Distribution:
		return "distribution"
	case Balance:
		return "balance"
	}
	return "unknown"
}

// Plugin is what every filter, scorer and picker is. Type is the registered
// plugin type ("prefix_cache"), used in explanations and errors.
type Plugin interface {
	Type() string
}

// Filter narrows the candidates. It receives the positions (into c.Hosts) of
// the hosts still in play and returns the survivors, filtered in place
// (cand[:k]). A filter that would remove every host decides itself whether
// that is an error (return empty: wrong model) or must fail open (return cand
// unchanged: nobody healthy).
type Filter interface {
	Plugin
	Filter(c *Cycle, cand []int) []int
}

// Scorer writes a score in [0, 1] for each candidate into out, indexed by
// host position: out[p] for every p in cand. Higher is better. Entries not in
// cand must not be read.
type Scorer interface {
	Plugin
	Category() Category
	Score(c *Cycle, cand []int, out []float64)
}

// Picker orders the candidates: it appends host positions to order, primary
// first, then fallbacks, at most c.MaxPicks in all, and returns it. scores is
// the weighted total per host position (all zero when the profile has no
// scorers).
type Picker interface {
	Plugin
	Pick(c *Cycle, cand []int, scores []float64, order []int) []int
}

// Cycle is the context of one profile run: the request, the hosts, and the
// run's randomness and scratch space. Plugins read it; they must not retain
// it past the call.
type Cycle struct {
	Req   *Request
	Hosts []Host
	// MaxPicks bounds the picker's output: the primary plus fallbacks.
	MaxPicks int
	// Rand is the decision's random source (tie-breaks, sampling).
	Rand *rand.Rand
	// Role is the work this run picks a host for: RoleDecode and
	// RolePrefill in a disaggregated handler, RoleBoth otherwise.
	Role Role

	s    *Scratch
	note string
}

// Note records a short constant reason for the explanation ("imbalance
// guard", "spill"). The last note wins. It must never contain request data.
func (c *Cycle) Note(reason string) { c.note = reason }

// Floats returns a scratch slice of len(c.Hosts) float64s for a plugin's
// temporary use during this call (contents undefined). It is overwritten by
// the next call of Floats. Profile.run sizes it with its other buffers, so
// in a run this is a plain load (no allocation code inlined into every
// plugin that calls it); a Cycle made by hand (tests) sizes it here.
func (c *Cycle) Floats() []float64 {
	if len(c.s.tmp) != len(c.Hosts) {
		c.s.size(len(c.Hosts), 0)
	}
	return c.s.tmp
}

// Scratch holds the buffers of decisions so that a steady-state decision does
// not allocate. It is not safe for concurrent use: give each goroutine (each
// Envoy worker VM has one) its own.
type Scratch struct {
	rng *rand.Rand
	// cand, total, tmp and every raw slice are the same length, the host
	// count of the last run (see size).
	cand    []int
	order   []int
	total   []float64
	tmp     []float64
	raw     [][]float64 // per scorer, per host position
	cycle   Cycle
	pcg     rand.PCG
	seeded  bool
	prefill *Scratch // second profile of a disaggregated decision
}

// NewScratch returns scratch space whose random source is seeded with seed,
// so that simulations are repeatable.
func NewScratch(seed uint64) *Scratch {
	s := &Scratch{}
	s.pcg.Seed(seed, seed^0x9e3779b97f4a7c15)
	s.rng = rand.New(&s.pcg)
	s.seeded = true
	return s
}

// prepare seeds a zero Scratch's random source on first use and sizes the
// per-run buffers for n hosts and k scorers. Profile.run checks whether either
// is needed and calls it only then (the first decision, a change of fleet size
// or scorer count): each function entered costs a request
// (docs/performance.md), and one rare call site is less code than two.
//
//go:noinline
func (s *Scratch) prepare(n, k int) {
	if !s.seeded {
		s.seed()
	}
	if len(s.total) != n || len(s.raw) < k {
		s.size(n, k)
	}
}

func (s *Scratch) seed() {
	s.pcg.Seed(rand.Uint64(), rand.Uint64())
	s.rng = rand.New(&s.pcg)
	s.seeded = true
}

// size makes the per-run buffers (cand, total and at least k raw score slices)
// n hosts long. Profile.run calls it only when the fleet size or the scorer
// count changed, so a steady decision neither stores the buffers back (a write
// barrier each) nor enters the allocator's code: each function entered costs a
// request (docs/performance.md).
func (s *Scratch) size(n, k int) {
	s.cand = growInts(s.cand, n)
	s.total = growFloats(s.total, n)
	s.tmp = growFloats(s.tmp, n)
	for len(s.raw) < k {
		s.raw = append(s.raw, nil)
	}
	for i := range s.raw {
		s.raw[i] = growFloats(s.raw[i], n)
	}
}

func growFloats(s []float64, n int) []float64 {
	if cap(s) < n {
		return make([]float64, n, n+n/4)
	}
	return s[:n]
}

func growInts(s []int, n int) []int {
	if cap(s) < n {
		return make([]int, n, n+n/4)
	}
	return s[:n]
}
