// Package router is the glue between the prefix index, the load accounting
// and the decision layer: the one call the Envoy filter and the fleet
// simulator both make per request, so the strategy measured in the
// simulator is the strategy that ships.
//
// A request's life as the router sees it:
//
//	t := r.Decide(in, hosts)   // query matches, run the profile, record, account
//	r.FirstToken(&t)           // prefill done: its tokens stop counting as pending
//	r.Feedback(&t, cached)     // the engine's cached_tokens confirms or corrects
//	r.Release(&t)              // stream end (or reset): every counter returns
//
// Like scorer and index, it imports no proxy-wasm SDK and allocates nothing
// per decision once warm. It is not safe for concurrent use without the
// internal lock it takes; Envoy runs one VM per worker thread, each with its
// own Router over the same shared data.
package router

import (
	"sync"

	"github.com/kvroute/kvroute/scorer"
)

// PrefixIndex is what the router needs from the prefix index (index.Index
// through IndexAdapter, or a fake in tests).
type PrefixIndex interface {
	// Match sets matched[i] to the number of leading blocks of chain that
	// the host in slot slots[i] holds (0 for a negative slot).
	Match(chain []uint64, slots []int, matched []int32) error
	// Record notes that the host in slot now holds chain, of which it
	// already held the first held blocks.
	Record(slot int, chain []uint64, held int) error
}

// TokenCounter converts a number of leading blocks to prompt tokens. The
// index's Hasher implements it (block sizes may vary along the chain).
type TokenCounter interface {
	TokensIn(blocks int) int
}

// Load is one host's outstanding work as the gateway accounts it.
type Load struct {
	InFlight      int64
	PrefillTokens int64 // prompt tokens sent and not yet prefilled
	DecodeTokens  int64 // output tokens requested and not yet finished
	KVTokens      int64 // prompt + max tokens of requests in flight
}

func (l *Load) add(d Load, sign int64) {
	l.InFlight += sign * d.InFlight
	l.PrefillTokens += sign * d.PrefillTokens
	l.DecodeTokens += sign * d.DecodeTokens
	l.KVTokens += sign * d.KVTokens
}

// LoadBook holds per-host load counters, by index slot. The filter backs it
// with shared data (all workers see one book); MemLoad serves the simulator
// and tests.
type LoadBook interface {
	Get(slot int) Load
	// Add adds delta (which may be negative) to slot's counters.
	Add(slot int, delta Load)
}

// SessionTable pins session keys to host addresses.
type SessionTable interface {
	Get(key string) (address string, ok bool)
	Put(key, address string)
}

// Input is what the filter extracts from one request. It holds no prompt
// text: the chain of block hashes stands for it.
type Input struct {
	Model, Adapter string
	SessionKey     string
	PromptTokens   int
	MaxTokens      int
	// Chain is the request's block hash chain (index.Hasher.Blocks).
	Chain []uint64
	// Tokens converts matched blocks to tokens; nil assumes blocks of equal
	// size (PromptTokens / len(Chain)).
	Tokens TokenCounter
	// PrefixBlocks is how many leading blocks make the consistent-hashing
	// key (prefix_hash); 0 means DefaultPrefixBlocks.
	PrefixBlocks int
}

// DefaultPrefixBlocks is the prefix length hashed for prefix_hash: long
// enough to separate system prompts, short enough that a conversation's
// turns keep their key.
const DefaultPrefixBlocks = 4

// Ticket is the router's record of one dispatched request, returned by
// Decide and handed back at first token, feedback and release. It holds
// slots and numbers only.
type Ticket struct {
	// Host and Prefill are the chosen positions in the hosts slice given to
	// Decide (-1 when none); their slots are kept for the release.
	Host, Prefill         int
	Slot, PrefillSlot     int
	Address               string
	PredictedCachedTokens int
	load, prefillLoad     Load
	firstToken, released  bool
}

// Stats are cumulative counters for the filter's metrics.
type Stats struct {
	Decisions, NoCandidate, Disaggregated uint64
	// PredictedCachedTokens sums what the index predicted for the chosen
	// hosts; ConfirmedCachedTokens sums what engines reported back for the
	// same requests (only those with feedback). Their gap is the index's
	// drift.
	PredictedCachedTokens, ConfirmedCachedTokens    uint64
	FeedbackRequests, OverPredicted, UnderPredicted uint64
	IndexErrors                                     uint64
}

// Config assembles a Router. Only Handler is required.
type Config struct {
	Handler *scorer.Handler
	// Index is the prefix index; nil routes without prefix matches.
	Index PrefixIndex
	// Load defaults to a fresh MemLoad.
	Load LoadBook
	// Sessions defaults to a MemSessions of 65,536 entries.
	Sessions SessionTable
	// Seed seeds the decision randomness (0: random).
	Seed uint64
}

// Router makes decisions and keeps the books.
type Router struct {
	mu       sync.Mutex
	handler  *scorer.Handler
	index    PrefixIndex
	load     LoadBook
	sessions SessionTable
	scratch  *scorer.Scratch
	req      scorer.Request
	slots    []int
	stats    Stats
}

// New returns a Router for cfg.
func New(cfg Config) *Router {
	r := &Router{handler: cfg.Handler, index: cfg.Index, load: cfg.Load, sessions: cfg.Sessions}
	if r.load == nil {
		r.load = &MemLoad{}
	}
	if r.sessions == nil {
		r.sessions = NewMemSessions(65536)
	}
	if cfg.Seed != 0 {
		r.scratch = scorer.NewScratch(cfg.Seed)
	} else {
		r.scratch = &scorer.Scratch{}
	}
	return r
}

// Handler returns the strategy the router runs.
func (r *Router) Handler() *scorer.Handler { return r.handler }

// Stats returns a copy of the counters.
func (r *Router) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Decide picks the host(s) for one request among hosts (whose Slot fields
// must be the index slots), records the decision in the index and accounts
// the load. It overwrites the hosts' own-accounting fields (InFlight,
// PendingPrefillTokens, PendingDecodeTokens, InFlightTokens) from the load
// book. The returned Result's slices are valid until the next Decide.
//
// An index error does not fail the decision: it routes without prefix
// matches and is counted.
func (r *Router) Decide(in *Input, hosts []scorer.Host) (Ticket, scorer.Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(hosts)
	req := &r.req
	req.Reset(n)
	req.Model, req.Adapter, req.SessionKey = in.Model, in.Adapter, in.SessionKey
	req.PromptTokens, req.MaxTokens = in.PromptTokens, in.MaxTokens
	req.TotalBlocks = len(in.Chain)
	if len(in.Chain) > 0 {
		k := in.PrefixBlocks
		if k <= 0 {
			k = DefaultPrefixBlocks
		}
		req.PrefixHash = in.Chain[min(k, len(in.Chain))-1]
	}

	if cap(r.slots) < n {
		r.slots = make([]int, n)
	}
	r.slots = r.slots[:n]
	for i := range hosts {
		h := &hosts[i]
		r.slots[i] = h.Slot
		if h.Slot >= 0 {
			l := r.load.Get(h.Slot)
			h.InFlight = int(l.InFlight)
			h.PendingPrefillTokens = l.PrefillTokens
			h.PendingDecodeTokens = l.DecodeTokens
			h.InFlightTokens = l.KVTokens
		}
	}
	if r.index != nil && len(in.Chain) > 0 {
		if err := r.index.Match(in.Chain, r.slots, req.MatchedBlocks); err != nil {
			r.stats.IndexErrors++
			clear(req.MatchedBlocks)
		}
		for i, b := range req.MatchedBlocks {
			req.MatchedTokens[i] = int32(tokensIn(in, int(b)))
		}
	}
	if in.SessionKey != "" {
		req.PinnedAddress, _ = r.sessions.Get(in.SessionKey)
	}

	res := r.handler.Run(req, hosts, r.scratch)
	r.stats.Decisions++
	t := Ticket{Host: res.Decode.Primary(), Prefill: -1, Slot: -1, PrefillSlot: -1}
	if t.Host < 0 {
		r.stats.NoCandidate++
		return t, res
	}
	h := &hosts[t.Host]
	t.Slot, t.Address = h.Slot, h.Address
	held, cached := req.Matched(t.Host)
	if in.SessionKey != "" && req.PinnedAddress != h.Address {
		r.sessions.Put(in.SessionKey, h.Address)
	}

	prompt := int64(in.PromptTokens)
	out := int64(max(in.MaxTokens, 0))
	if res.Disaggregated {
		r.stats.Disaggregated++
		p := res.Prefill.Primary()
		t.Prefill = p
		t.PrefillSlot = hosts[p].Slot
		pheld, pcached := req.Matched(p)
		t.PredictedCachedTokens = pcached
		// The prefill host computes the uncached prompt and keeps its KV
		// while transferring; the decode host receives the whole prompt.
		t.prefillLoad = Load{InFlight: 1, PrefillTokens: max(prompt-int64(pcached), 0), KVTokens: prompt}
		t.load = Load{InFlight: 1, DecodeTokens: out, KVTokens: prompt + out}
		r.record(t.PrefillSlot, in.Chain, pheld)
		r.record(t.Slot, in.Chain, held)
	} else {
		t.PredictedCachedTokens = cached
		t.load = Load{InFlight: 1, PrefillTokens: max(prompt-int64(cached), 0), DecodeTokens: out, KVTokens: prompt + out}
		r.record(t.Slot, in.Chain, held)
	}
	r.stats.PredictedCachedTokens += uint64(t.PredictedCachedTokens)
	if t.Slot >= 0 {
		r.load.Add(t.Slot, t.load)
	}
	if t.PrefillSlot >= 0 {
		r.load.Add(t.PrefillSlot, t.prefillLoad)
	}
	return t, res
}

func tokensIn(in *Input, blocks int) int {
	if blocks <= 0 {
		return 0
	}
	if in.Tokens != nil {
		return min(in.Tokens.TokensIn(blocks), in.PromptTokens)
	}
	if len(in.Chain) == 0 {
		return 0
	}
	return int(int64(in.PromptTokens) * int64(min(blocks, len(in.Chain))) / int64(len(in.Chain)))
}

func (r *Router) record(slot int, chain []uint64, held int) {
	if r.index == nil || slot < 0 || len(chain) == 0 {
		return
	}
	if err := r.index.Record(slot, chain, held); err != nil {
		r.stats.IndexErrors++
	}
}

// FirstToken marks the end of prefill: the request's prompt tokens stop
// counting as pending prefill work (on the prefill host too, when
// disaggregated). Idempotent.
func (r *Router) FirstToken(t *Ticket) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.firstToken || t.released {
		return
	}
	t.firstToken = true
	if t.Slot >= 0 && t.load.PrefillTokens != 0 {
		r.load.Add(t.Slot, Load{PrefillTokens: -t.load.PrefillTokens})
		t.load.PrefillTokens = 0
	}
	// A disaggregated request's prefill host is done once decode starts.
	if t.PrefillSlot >= 0 {
		r.load.Add(t.PrefillSlot, Load{InFlight: -t.prefillLoad.InFlight, PrefillTokens: -t.prefillLoad.PrefillTokens, KVTokens: -t.prefillLoad.KVTokens})
		t.prefillLoad = Load{}
	}
}

// Feedback takes the engine's usage.prompt_tokens_details.cached_tokens for
// the request and compares it with the prediction. The index needs no
// correction for this host (it has just computed and holds the whole
// prompt); the comparison is the drift metric that tells an operator
// whether the index's block size and capacity match the engines.
func (r *Router) Feedback(t *Ticket, cachedTokens int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cachedTokens < 0 {
		return
	}
	r.stats.FeedbackRequests++
	r.stats.ConfirmedCachedTokens += uint64(cachedTokens)
	// Engines count cache hits in their own block size (16 tokens in
	// vLLM); allow one such block of slack either way.
	const slack = 16
	switch {
	case t.PredictedCachedTokens > cachedTokens+slack:
		r.stats.OverPredicted++
	case t.PredictedCachedTokens+slack < cachedTokens:
		r.stats.UnderPredicted++
	}
}

// Release returns every counter the request still holds: call it exactly
// when the stream ends, completed or reset. Idempotent.
func (r *Router) Release(t *Ticket) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.released {
		return
	}
	t.released = true
	if t.Slot >= 0 {
		r.load.Add(t.Slot, negate(t.load))
		t.load = Load{}
	}
	if t.PrefillSlot >= 0 {
		r.load.Add(t.PrefillSlot, negate(t.prefillLoad))
		t.prefillLoad = Load{}
	}
}

func negate(l Load) Load {
	return Load{InFlight: -l.InFlight, PrefillTokens: -l.PrefillTokens, DecodeTokens: -l.DecodeTokens, KVTokens: -l.KVTokens}
}

// MemLoad is an in-process LoadBook, indexed by slot.
type MemLoad struct {
	mu    sync.Mutex
	slots []Load
}

// Get implements LoadBook.
func (m *MemLoad) Get(slot int) Load {
	m.mu.Lock()
	defer m.mu.Unlock()
	if slot < 0 || slot >= len(m.slots) {
		return Load{}
	}
	return m.slots[slot]
}

// Add implements LoadBook. Counters never go below zero: a release after
// the slot was reset must not leave negative load behind.
func (m *MemLoad) Add(slot int, d Load) {
	if slot < 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for slot >= len(m.slots) {
		m.slots = append(m.slots, Load{})
	}
	l := &m.slots[slot]
	l.add(d, 1)
	l.InFlight = max(l.InFlight, 0)
	l.PrefillTokens = max(l.PrefillTokens, 0)
	l.DecodeTokens = max(l.DecodeTokens, 0)
	l.KVTokens = max(l.KVTokens, 0)
}
