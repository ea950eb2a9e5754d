// Package dispatch is the glue between the prefix index, the load accounting
// and the decision layer: the one call the Envoy filter and the fleet
// simulator both make per request, so the strategy measured in the
// simulator is the strategy that ships.
//
// A request's life as the dispatcher sees it:
//
//	t, res := r.Decide(in, hosts) // query matches, run the profile, record, account
//	r.FirstToken(&t)              // prefill done: its tokens stop counting as pending
//	r.Feedback(&t, cached)        // the engine's cached_tokens vs the prediction
//	r.Release(&t)                 // stream end (or reset): every counter returns
//	r.Finish(&t, cached)          // or both at once (cached < 0: no feedback)
//
// The prefix matches and the load counters live in the index (shared data,
// seen by every Envoy worker). The KV footprint of requests in flight, which
// only the dynamo_kv emulation reads, is kept per dispatcher.
//
// Like scorer and index, it imports no proxy-wasm SDK and allocates nothing
// per decision once warm. One Dispatcher per Envoy worker VM (or simulator
// goroutine); its methods take an internal lock, so sharing one is safe but
// serialises.
package dispatch

import (
	"errors"
	"sync"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scorer"
)

// TokenCounter converts a number of leading blocks to prompt tokens. The
// index's Hasher implements it (block sizes vary along the chain).
type TokenCounter interface {
	TokensIn(blocks int) int
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
	// Tokens converts matched blocks to tokens, normally the Hasher that
	// produced Chain; nil assumes blocks of equal size.
	Tokens TokenCounter
	// PrefixBlocks is how many leading blocks make the consistent-hashing
	// key (prefix_hash); 0 means DefaultPrefixBlocks.
	PrefixBlocks int
	// PromptChars is the prompt's canonical length in characters
	// (index.Hasher.Len): with the engine's usage.prompt_tokens it
	// calibrates the model's characters per token. 0: no calibration.
	PromptChars int
	// NowMs is the decision's clock reading in the index's milliseconds:
	// the index takes it for the whole decision instead of reading the
	// clock three or four times (each a host call in Wasm, two through
	// time.Now). 0: the index reads its clock.
	NowMs int64
}

// DefaultPrefixBlocks is the prefix length hashed for prefix_hash: with the
// index's default 256-character blocks, about 1 KB of prompt — enough to
// tell system prompts apart, short enough that a conversation keeps its key
// as it grows.
const DefaultPrefixBlocks = 4

// Ticket is the dispatcher's record of one dispatched request, returned by
// Decide and handed back at first token, feedback and release. It holds
// slots and numbers only.
type Ticket struct {
	// Host and Prefill are the chosen positions in the hosts slice given to
	// Decide (-1 when none).
	Host, Prefill int
	// Address and PrefillAddress name them.
	Address, PrefillAddress string
	// PredictedCachedTokens is what the index expected the engine to find
	// cached (on the prefill host when disaggregated).
	PredictedCachedTokens int

	decode, prefill  hold
	firstToken, done bool
	// predictedRaw is the index's prediction before any trust discount,
	// which is what feedback must be compared with. Only learnTrust reads
	// it, so Decide fills it only under a TrustFeedback profile: for the
	// others it would cost each request a second token count (two calls,
	// one through an interface, in Wasm) for nothing.
	predictedRaw int
	// stamp is the index's answer for the host whose cache the request
	// used (stampRef), kept for Correct when the engine confirms less.
	stamp    index.MatchStamp
	stampRef index.HostRef
	// EnginePromptTokens is the engine's usage.prompt_tokens for the
	// request, set by the caller before Feedback or Finish (0: not
	// reported); with the prompt's characters it calibrates the model's
	// characters per token.
	EnginePromptTokens int
	promptChars        int
	model              string
	sample             bool // SampleUsage
	// TTFTMs is the time from the decision to the first token in
	// milliseconds, which the caller sets when it sees it (0: not seen, as
	// for a response that is not streamed). With a predicted_ttft profile,
	// feedback then teaches the host's model that work (the predicted_ttft
	// work on the chosen host at the decision, corrected by the engine's
	// cached tokens) took that long.
	TTFTMs  float64
	work    float64
	workRef index.HostRef
}

// SampleUsage says whether the dispatcher wants the engine's prompt_tokens for
// this request (EnginePromptTokens): every request of a model until it is
// calibrated, then one in 16, so most responses skip reading it.
func (t *Ticket) SampleUsage() bool { return t.sample }

// hold is what one request added to one host's counters, so that exactly
// that is taken back.
type hold struct {
	slot                      int
	ix                        index.LoadTicket // counters in the index
	inflight, prefill, decode int64            // dispatcher-local counters (no index)
	kv                        int64            // dispatcher-local KV footprint
}

// Stats are cumulative counters for the filter's metrics.
type Stats struct {
	Decisions, NoCandidate, Disaggregated uint64
	// PredictedCachedTokens sums what the index predicted for the chosen
	// hosts of requests that got feedback; ConfirmedCachedTokens sums what
	// the engines reported for them. Their gap is the index's drift.
	PredictedCachedTokens, ConfirmedCachedTokens    uint64
	FeedbackRequests, OverPredicted, UnderPredicted uint64
	// PredictionErrorTokens sums |predicted - confirmed| per request with
	// feedback: over ConfirmedCachedTokens it is the block-weighted
	// prediction error (PredictionError), where over- and under-predictions
	// of different requests do not cancel out.
	PredictionErrorTokens uint64
	// IndexErrors counts failed index reads or writes (the decision went on
	// without them); LoadErrors counts load updates dropped under
	// contention.
	IndexErrors, LoadErrors uint64
	// TTFTDropped counts time-to-first-token samples not stored because
	// other workers kept winning the shared record (predicted_ttft).
	TTFTDropped uint64
	// CASRetries counts the index's compare-and-swap retries (writes that
	// lost a race with another worker and went again).
	CASRetries uint64
}

// Add adds o's counters to s (the workers of a simulated gateway).
func (s *Stats) Add(o Stats) {
	s.Decisions += o.Decisions
	s.NoCandidate += o.NoCandidate
	s.Disaggregated += o.Disaggregated
	s.PredictedCachedTokens += o.PredictedCachedTokens
	s.ConfirmedCachedTokens += o.ConfirmedCachedTokens
	s.PredictionErrorTokens += o.PredictionErrorTokens
	s.FeedbackRequests += o.FeedbackRequests
	s.OverPredicted += o.OverPredicted
	s.UnderPredicted += o.UnderPredicted
	s.IndexErrors += o.IndexErrors
	s.LoadErrors += o.LoadErrors
	s.TTFTDropped += o.TTFTDropped
	s.CASRetries += o.CASRetries
}

// PredictionError is the block-weighted prediction error: the sum over
// requests with feedback of |predicted - confirmed| cached tokens, over the
// confirmed cached tokens. With nothing confirmed it is 0 when nothing was
// mispredicted either, and 1 (all wrong) otherwise.
func (s Stats) PredictionError() float64 {
	if s.ConfirmedCachedTokens == 0 {
		return min(float64(s.PredictionErrorTokens), 1)
	}
	return float64(s.PredictionErrorTokens) / float64(s.ConfirmedCachedTokens)
}

// Config assembles a Dispatcher.
type Config struct {
	// Handler is the strategy (required).
	Handler *scorer.Handler
	// Index holds prefix matches and load counters. nil routes without
	// prefix matches and keeps load counters in the dispatcher.
	Index *index.Index
	// Sessions defaults to a SharedSessions over Shared, or without it
	// to a MemSessions of 65,536 entries.
	Sessions SessionTable
	// Shared, when set, is the gateway's shared data (the store the
	// Index uses): the session pins and the prefix memory then live in it,
	// one table per gateway whatever its worker count, instead of one per
	// Dispatcher (docs/topology.md).
	Shared index.Store
	// Seed seeds the decision randomness (0: random).
	Seed uint64
	// NoCorrect keeps the index as routing wrote it when an engine
	// confirms fewer cached tokens than predicted, whatever the profile.
	// Under a profile with CorrectIndex (kvroute's default) the host's
	// least recently used blocks, up to the shortfall and no newer than the
	// prediction's last block, otherwise stop counting (index.Correct): the
	// engine evicted them, so its LRU evicted everything older too.
	NoCorrect bool
}

// Dispatcher books and releases dispatched requests: it makes each
// decision (Decide), books its load and prefix in the index, and takes them
// back at first token, feedback and stream end (FirstToken, Finish).
type Dispatcher struct {
	mu       sync.Mutex
	handler  *scorer.Handler
	ix       *index.Index
	sessions SessionTable
	memory   prefixMemory  // deep prefix hash -> last host (prefix_memory), per Dispatcher
	shared   *sharedMemory // the same in shared data (Config.Shared), per gateway
	// useMemory: the handler scores by prefix memory, so Decide looks it
	// up and stores to it.
	useMemory bool
	scratch   *scorer.Scratch
	req       scorer.Request
	matches   index.Matches
	loads     []index.Load
	local     []localLoad        // by slot: KV footprint, and all counters without an index
	addrs     []string           // slot addresses without an index
	trust     []float64          // by slot: confirmed over predicted cached tokens, EWMA (0 = no sample)
	correct   bool               // Correct the index on over-predictions (Config.NoCorrect unset)
	corrected []index.MatchStamp // by slot: the stamp of the last correction
	// Characters per token by model, learned from the engines' usage
	// (calibrate); calModel's value is cached in calCPT (0: not learned),
	// and hashCPT is the index's fixed estimate the hasher counts with.
	cal      map[string]float64
	calModel string
	calCPT   float64
	hashCPT  float64
	calF     float64 // hashCPT / calCPT, 0 when not learned
	calDirty bool    // calCPT moved since it was stored in cal
	// ttft holds the hosts' time-to-first-token models when the handler
	// scores by them (predicted_ttft; nil otherwise), ttftDW the decode
	// weight its work counts with.
	ttft   *ttftModels
	ttftDW float64
	stats  Stats
	// slots is this worker's view of the index's slot table (SetHosts).
	slots slotTable
}

type localLoad struct {
	inflight, prefill, decode, kv int64
}

// New returns a Dispatcher for cfg.
func New(cfg Config) *Dispatcher {
	r := &Dispatcher{handler: cfg.Handler, ix: cfg.Index, sessions: cfg.Sessions, useMemory: cfg.Handler.ReadsPrefixMemory(),
		correct: !cfg.NoCorrect && cfg.Index != nil && cfg.Handler.CorrectIndex()}
	if r.sessions == nil {
		if cfg.Shared != nil {
			r.sessions = NewSharedSessions(cfg.Shared)
		} else {
			r.sessions = NewMemSessions(65536)
		}
	}
	if cfg.Shared != nil && r.useMemory {
		r.shared = newSharedMemory(cfg.Shared)
	}
	if dw, ok := cfg.Handler.ReadsTTFT(); ok {
		r.ttft, r.ttftDW = newTTFTModels(cfg.Shared), dw
	}
	r.hashCPT = index.DefaultCharsPerToken
	if cfg.Index != nil {
		r.hashCPT = float64(cfg.Index.Config().Hash.CharsPerToken)
	}
	if cfg.Seed != 0 {
		r.scratch = scorer.NewScratch(cfg.Seed)
	} else {
		r.scratch = &scorer.Scratch{}
	}
	return r
}

// Handler returns the strategy the dispatcher runs.
func (r *Dispatcher) Handler() *scorer.Handler { return r.handler }

// Stats returns a copy of the counters.
//
// It unlocks without defer: the copy cannot panic, and a
// deferred call is a function of its own (a deferwrap) that every request
// enters in Wasm.
func (r *Dispatcher) Stats() Stats {
	r.mu.Lock()
	s := r.stats
	if r.ix != nil {
		s.CASRetries = r.ix.CASRetries()
	}
	r.mu.Unlock()
	return s
}

// Register gives addr an index slot (the filter calls it for every
// endpoint, the simulator for every replica) and returns the Slot and Gen to
// put in its scorer.Host. Without an index, slots are handed out in order.
func (r *Dispatcher) Register(addr string, h *scorer.Host) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ix == nil {
		r.registerLocal(addr, h)
		return nil
	}
	ref, err := r.ix.Register(addr)
	if err != nil {
		return err
	}
	h.Address, h.Slot, h.Gen = addr, ref.Slot, ref.Gen
	return nil
}

// registerLocal is Register without an index: slots in order of first
// registration.
func (r *Dispatcher) registerLocal(addr string, h *scorer.Host) {
	slot := -1
	for i, a := range r.addrs {
		if a == addr {
			slot = i
		}
	}
	if slot < 0 {
		slot = len(r.addrs)
		r.addrs = append(r.addrs, addr)
		r.growLocal(slot)
	}
	h.Address, h.Slot, h.Gen = addr, slot, 1
}

// growLocal extends the local table to hold slot. It runs only when a slot is
// first seen (Register, or Decide through grow for every host it is given), so
// book, prefillDone and release index the table directly: a slot they see was
// booked by a Decide that grew the table to it, and the table never shrinks.
// Out of line (noinline) so that no request's path carries the growth code:
// each function entered costs a request (docs/performance.md).
//
//go:noinline
func (r *Dispatcher) growLocal(slot int) {
	for slot >= len(r.local) {
		r.local = append(r.local, localLoad{})
	}
}

// Decide picks the host(s) for one request among hosts (whose Slot and Gen
// come from Register), records the decision in the index and accounts the
// load. It overwrites the hosts' own-accounting fields (InFlight,
// PendingPrefillTokens, PendingDecodeTokens, InFlightTokens) from the load
// counters. The Result's slices are valid until the next Decide.
//
// An index error does not fail the decision: it goes on without prefix
// matches and is counted.
func (r *Dispatcher) Decide(in *Input, hosts []scorer.Host) (t Ticket, res scorer.Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pinned := in.NowMs != 0 && r.ix != nil
	if pinned {
		r.ix.PinClock(in.NowMs)
	}
	n := len(hosts)
	maxSlot := -1
	for i := range hosts {
		if s := hosts[i].Slot; s > maxSlot {
			maxSlot = s
		}
	}
	if in.Model != r.calModel {
		r.loadCal(in.Model)
	}
	// A calibrated model's token counts, from the index's fixed characters
	// per token to the model's (calibrate): the prompt's here, each
	// matched prefix's in the loop below. Arithmetic in line, no function
	// entered per request (in Wasm each one costs).
	f := r.calF
	prompt := in.PromptTokens
	if f != 0 {
		prompt = int(float64(prompt) * f)
	}
	req := &r.req
	if cap(req.MatchedBlocks) < n || cap(req.MatchedTokens) < n || maxSlot >= len(r.local) {
		r.grow(n, maxSlot)
	}
	mb, mt := req.MatchedBlocks[:n], req.MatchedTokens[:n]
	clear(mb)
	clear(mt)
	// The whole request in one store: Request.Reset and then each field
	// would write every string and slice header twice.
	*req = scorer.Request{
		Model: in.Model, Adapter: in.Adapter, SessionKey: in.SessionKey,
		PromptTokens: prompt, MaxTokens: in.MaxTokens,
		PrefixHash: prefixHash(in), TotalBlocks: len(in.Chain),
		MatchedBlocks: mb, MatchedTokens: mt,
	}

	queried := false
	if r.ix != nil && len(in.Chain) > 0 {
		if err := r.ix.Query(in.Chain, &r.matches); err != nil {
			r.stats.IndexErrors++
		} else {
			queried = true
		}
	}
	if r.ix != nil {
		r.loads = r.ix.Loads(r.loads)
	}
	// One pass over the hosts with the invariants hoisted: which counters
	// feed the hosts, whether matches (and trust) apply. The local table
	// was grown above to the largest slot, once instead of per host.
	local, loads := r.local, r.loads
	var blocks []int
	if queried {
		blocks = r.matches.Blocks
	}
	var trust []float64
	learn := r.handler.Decode.TrustFeedback
	if learn {
		trust = r.trust
	}
	for i := range hosts {
		h := &hosts[i]
		slot := h.Slot
		if slot < 0 {
			continue
		}
		l := &local[slot]
		h.InFlightTokens = l.kv
		if r.ix != nil {
			var il index.Load
			if slot < len(loads) {
				il = loads[slot]
			}
			h.InFlight = int(il.InFlight)
			h.PendingPrefillTokens = int64(il.PrefillTokens)
			h.PendingDecodeTokens = int64(il.DecodeTokens)
		} else {
			h.InFlight = int(l.inflight)
			h.PendingPrefillTokens = l.prefill
			h.PendingDecodeTokens = l.decode
		}
		if h.LoadMirror > 0 {
			addRemote(h)
		}
		if slot < len(blocks) {
			b := blocks[slot]
			mb[i] = int32(b)
			if b <= 0 {
				continue // tokensIn(in, b) is 0, and so is any share of it
			}
			tok := tokensIn(in, b)
			if f != 0 {
				tok = int(float64(tok) * f)
			}
			if slot < len(trust) && trust[slot] > 0 {
				tok = int(float64(tok) * trust[slot])
			}
			mt[i] = int32(tok)
		}
	}
	in.PromptTokens = prompt // booked below, and the caller's count
	if in.SessionKey != "" {
		r.loadPin(in.SessionKey)
	}
	if r.useMemory {
		if r.shared != nil {
			if i := r.shared.lookup(in.Chain, hosts); i >= 0 {
				req.PrefixAddress = hosts[i].Address
			}
		} else {
			req.PrefixAddress = r.memory.lookup(in.Chain)
		}
	}

	if r.ttft != nil {
		r.ttft.fill(hosts)
	}

	// The common single-profile handler's decision without Handler.Run
	// around it: one function less entered per request in Wasm.
	if hd := r.handler; hd.Prefill == nil {
		res.Decode = hd.Decode.Run(req, hosts, hd.Picks(), r.scratch)
	} else {
		r.runDisaggregated(&res, hosts)
	}
	r.stats.Decisions++
	t = Ticket{Host: res.Decode.Primary(), Prefill: -1, decode: hold{slot: -1}, prefill: hold{slot: -1}, promptChars: in.PromptChars, model: in.Model,
		sample: in.PromptChars > 0 && (f == 0 || r.stats.Decisions&15 == 0)}
	// One return, and named results filled in place: each return of
	// values copies the Ticket and the Result, code a Wasm build would
	// carry once per return site.
	if t.Host < 0 {
		r.stats.NoCandidate++
	} else {
		h := &hosts[t.Host]
		t.Address = h.Address
		if in.SessionKey != "" {
			r.pin(in.SessionKey, h.Address)
		}
		if r.useMemory {
			if r.shared != nil {
				r.shared.store(in.Chain, h.Address)
			} else {
				r.memory.store(in.Chain, h.Address)
			}
		}
		if res.Disaggregated {
			r.holdDisaggregated(&t, in, hosts, &res, queried)
		} else {
			prompt, out := max(in.PromptTokens, 0), max(in.MaxTokens, 0)
			hb, cached := req.Matched(t.Host)
			t.PredictedCachedTokens = cached
			if queried && hb > 0 {
				t.stamp, t.stampRef = r.matches.Stamp(h.Slot), index.HostRef{Slot: h.Slot, Gen: h.Gen}
			}
			if learn {
				t.predictedRaw = tokensIn(in, hb) // see Ticket.predictedRaw
			}
			if r.ttft != nil {
				r.keepWork(&t, hosts)
			}
			r.book(&t.decode, h, in.Chain, queried, max(prompt-cached, 0), out, prompt+out)
		}
	}
	if pinned {
		r.ix.UnpinClock()
	}
	return t, res
}

// addRemote turns a host's own load counts into estimates of the whole
// fleet's (see scorer.Host.LoadMirror). Out of Decide's line (noinline): a
// gateway without peers never enters it, and each function entered costs a
// request (docs/performance.md).
//
//go:noinline
func addRemote(h *scorer.Host) {
	m := h.LoadMirror
	h.InFlight = max(h.InFlight*m+h.RemoteInFlight, h.InFlight)
	h.PendingPrefillTokens = max(h.PendingPrefillTokens*int64(m)+h.RemotePrefillTokens, h.PendingPrefillTokens)
	h.PendingDecodeTokens = max(h.PendingDecodeTokens*int64(m)+h.RemoteDecodeTokens, h.PendingDecodeTokens)
}

// loadPin sets the request's PinnedAddress to the address the session table
// holds for key ("" when none). It and pin are out of Decide's line (noinline)
// because most requests carry no session key: each function entered costs a
// request (docs/performance.md), and these are interface calls with strings.
// It stores the address itself rather than returning it, so that Decide
// carries no string result and no store of it.
//
//go:noinline
func (r *Dispatcher) loadPin(key string) {
	r.req.PinnedAddress, _ = r.sessions.Get(key)
}

// storeMemory remembers addr for chain in the prefix memory.
func (r *Dispatcher) storeMemory(chain []uint64, addr string) {
	if r.shared != nil {
		r.shared.store(chain, addr)
		return
	}
	r.memory.store(chain, addr)
}

// Learn takes a route another gateway reported (through the metrics
// service's merged push): addr now holds chain from block from on (the
// blocks before from may be zero placeholders: from is a multiple of the
// index's segment length). The index marks them on the host (ref, as
// Register gave it) and, for a whole chain, the prefix memory remembers
// it, as if this gateway had routed it. The request's load is not booked:
// the reports carry the other gateways' load counts as such.
func (r *Dispatcher) Learn(ref index.HostRef, addr string, chain []uint64, from int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.useMemory && from == 0 && len(chain) > 0 {
		r.storeMemory(chain, addr)
	}
	if r.ix == nil || from >= len(chain) {
		return nil
	}
	return r.ix.Stored(ref, chain, from)
}

// pin pins key's session to addr unless the decision kept the pin.
//
//go:noinline
func (r *Dispatcher) pin(key, addr string) {
	if r.req.PinnedAddress != addr {
		r.sessions.Put(key, addr)
	}
}

// grow gives the request's per-candidate slices room for n hosts and the
// local table room for slot maxSlot. It runs only when the fleet grows, so
// it is out of Decide's line (noinline), like growLocal, and one call site
// for both growths: each call site is code in a Wasm build.
//
//go:noinline
func (r *Dispatcher) grow(n, maxSlot int) {
	if cap(r.req.MatchedBlocks) < n || cap(r.req.MatchedTokens) < n {
		r.req.Reset(n)
	}
	r.growLocal(maxSlot) // a no-op below len(r.local)
}

// runDisaggregated is Decide's decision for a handler with a prefill
// profile, written into res. Out of Decide's line (noinline) like
// holdDisaggregated: most handlers have one profile, and the Result
// copied out of Handler.Run would be code in every request's Decide.
//
//go:noinline
func (r *Dispatcher) runDisaggregated(res *scorer.Result, hosts []scorer.Host) {
	*res = r.handler.Run(&r.req, hosts, r.scratch)
}

// holdDisaggregated books a prefill/decode split decision on t: the prefill
// host computes the uncached prompt and holds its KV until the transfer; the
// decode host receives the whole prompt. It is out of Decide because most
// profiles never split: each function entered costs a request
// (docs/performance.md), so Decide keeps to the common path.
func (r *Dispatcher) holdDisaggregated(t *Ticket, in *Input, hosts []scorer.Host, res *scorer.Result, queried bool) {
	r.stats.Disaggregated++
	prompt, out := max(in.PromptTokens, 0), max(in.MaxTokens, 0)
	h := &hosts[t.Host]
	prefill := res.Prefill.Primary()
	t.Prefill = prefill
	p := &hosts[prefill]
	t.PrefillAddress = p.Address
	pb, pcached := r.req.Matched(prefill)
	t.PredictedCachedTokens = pcached
	if queried && pb > 0 {
		t.stamp, t.stampRef = r.matches.Stamp(p.Slot), index.HostRef{Slot: p.Slot, Gen: p.Gen}
	}
	if r.handler.Decode.TrustFeedback {
		t.predictedRaw = tokensIn(in, pb) // see Ticket.predictedRaw
	}
	r.book(&t.prefill, p, in.Chain, queried, max(prompt-pcached, 0), 0, prompt)
	r.book(&t.decode, h, in.Chain, queried, 0, out, prompt+out)
}

// prefixHash is the request's consistent-hashing key: the hash of its
// first PrefixBlocks blocks (0 without a chain).
func prefixHash(in *Input) uint64 {
	if len(in.Chain) == 0 {
		return 0
	}
	k := in.PrefixBlocks
	if k <= 0 {
		k = DefaultPrefixBlocks
	}
	return in.Chain[min(k, len(in.Chain))-1]
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

// book records in the index that h now holds the request's chain (as far as it
// matched, with the query's matches) and counts the request's load on h,
// keeping in hd, whose slot is -1 until then, what to take back. One function
// for both, as every booked host gets both: each function entered costs a
// request (docs/performance.md). hd is filled in place rather than returned:
// each return of a struct copies it.
func (r *Dispatcher) book(hd *hold, h *scorer.Host, chain []uint64, queried bool, prefill, decode, kv int) {
	if h.Slot < 0 {
		return
	}
	ref := index.HostRef{Slot: h.Slot, Gen: h.Gen}
	if r.ix != nil && len(chain) > 0 {
		var m *index.Matches
		if queried {
			m = &r.matches
		}
		if err := r.ix.Record(ref, chain, m); err != nil {
			r.stats.IndexErrors++
		}
	}
	hd.slot, hd.kv = h.Slot, int64(kv)
	l := &r.local[h.Slot] // Decide grew the table to every host's slot
	l.kv += hd.kv
	if r.ix == nil {
		hd.inflight, hd.prefill, hd.decode = 1, int64(prefill), int64(decode)
		l.inflight++
		l.prefill += hd.prefill
		l.decode += hd.decode
		return
	}
	var err error
	if hd.ix, err = r.ix.AddLoad(ref, prefill, decode); err != nil {
		r.stats.LoadErrors++
	}
}

// prefillDone takes back a hold's pending prefill tokens.
func (r *Dispatcher) prefillDone(hd *hold) {
	if hd.slot < 0 {
		return
	}
	if r.ix == nil {
		r.local[hd.slot].prefill -= hd.prefill
		hd.prefill = 0
		return
	}
	if err := r.ix.PrefillDone(&hd.ix); err != nil {
		r.stats.LoadErrors++
	}
}

// release takes back everything a hold still has.
func (r *Dispatcher) release(hd *hold) {
	if hd.slot < 0 {
		return
	}
	l := &r.local[hd.slot]
	l.kv -= hd.kv
	l.inflight -= hd.inflight
	l.prefill -= hd.prefill
	l.decode -= hd.decode
	*hd = hold{slot: hd.slot, ix: hd.ix}
	if r.ix == nil {
		return
	}
	var err error
	for range 3 { // contention drops an update: try again before counting a leak
		if err = r.ix.Release(&hd.ix); err == nil || !errors.Is(err, index.ErrContended) {
			break
		}
	}
	if err != nil {
		r.stats.LoadErrors++
	}
}

// FirstToken marks the end of prefill: the request's prompt tokens stop
// counting as pending prefill work, and a disaggregated request's prefill
// host is released. Idempotent.
func (r *Dispatcher) FirstToken(t *Ticket) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.firstToken || t.done {
		return
	}
	t.firstToken = true
	r.prefillDone(&t.decode)
	r.release(&t.prefill)
}

// Feedback takes the engine's usage.prompt_tokens_details.cached_tokens for
// the request and compares it with the prediction. The index needs no
// correction for this host (it has just computed and now holds the whole
// prompt); the comparison is the drift metric that tells an operator
// whether the index's block size and capacity match the engines'. A
// negative count (none reported) is ignored.
func (r *Dispatcher) Feedback(t *Ticket, cachedTokens int) { r.end(t, cachedTokens, false) }

// learnTrust updates the host's confirmed-over-predicted ratio, an EWMA
// over requests with a prediction of at least one engine block, capped at 1
// (under-prediction is not a reason to trust the index more than fully).
func (r *Dispatcher) learnTrust(t *Ticket, cached int) {
	slot := t.decode.slot
	if t.prefill.slot >= 0 { // disaggregated: the prefill host's cache was used
		slot = t.prefill.slot
	}
	if slot < 0 || t.predictedRaw < 16 {
		return
	}
	if slot >= len(r.trust) {
		r.growTrust(slot)
	}
	// Comparisons rather than min and max: for floats those are runtime
	// calls (NaN and signed-zero rules), code a Wasm build enters per
	// response, and neither value here can be NaN.
	ratio := float64(cached) / float64(t.predictedRaw)
	if ratio > 1 {
		ratio = 1
	}
	tr := &r.trust[slot]
	if *tr == 0 {
		*tr = ratio
	} else {
		*tr += 0.1 * (ratio - *tr)
	}
	if *tr < 0.05 {
		*tr = 0.05 // never forget a host entirely
	}
}

// keepWork keeps with t the predicted_ttft work on its host, for
// learnTTFT. Out of Decide's line (noinline): only predicted_ttft profiles
// enter it, and the code of a function entered counts against every
// request (docs/performance.md).
//
//go:noinline
func (r *Dispatcher) keepWork(t *Ticket, hosts []scorer.Host) {
	h := &hosts[t.Host]
	t.work, t.workRef = scorer.TTFTWork(&r.req, hosts, t.Host, r.ttftDW), index.HostRef{Slot: h.Slot, Gen: h.Gen}
}

// learnTTFT teaches the chosen host's model that t's work, with the
// request's own uncached tokens as the engine reported them, took t.TTFTMs
// to the first token. Out of end's line (noinline): only predicted_ttft
// profiles enter it.
//
//go:noinline
func (r *Dispatcher) learnTTFT(t *Ticket, cached int) {
	w := t.work + float64(t.PredictedCachedTokens-cached)
	if w < 1 {
		w = 1
	}
	r.ttft.learn(t.workRef, w, t.TTFTMs)
	r.stats.TTFTDropped = r.ttft.Contended
}

// ForgetSlot drops what the dispatcher learned about the host in slot (its
// trust in the index's predictions): call it when the slot is given to
// another host, which must not inherit the previous one's record. The
// load counters need nothing: they follow the slot's generation.
func (r *Dispatcher) ForgetSlot(slot int) {
	r.mu.Lock()
	r.forgetSlot(slot)
	r.mu.Unlock()
}

// forgetSlot is ForgetSlot under the lock (SetHosts does it itself when a
// slot changes hands).
func (r *Dispatcher) forgetSlot(slot int) {
	if slot >= 0 && slot < len(r.trust) {
		r.trust[slot] = 0
	}
}

// growTrust extends the trust table to hold slot. It runs once per slot,
// so it is kept out of learnTrust's line (noinline), like growLocal.
//
//go:noinline
func (r *Dispatcher) growTrust(slot int) {
	for slot >= len(r.trust) {
		r.trust = append(r.trust, 0)
	}
}

// Release returns every counter the request still holds. Call it when the
// stream ends, completed or reset. Idempotent.
func (r *Dispatcher) Release(t *Ticket) { r.end(t, -1, true) }

// Finish is Feedback(t, cachedTokens) and then Release(t), under one lock
// acquisition: the stream end of a request, with the engine's cached-token
// count, or a negative one when none was reported.
func (r *Dispatcher) Finish(t *Ticket, cachedTokens int) { r.end(t, cachedTokens, true) }

// end is Feedback, Release and Finish in one function: the filter ends each
// routed response with Finish, and each function entered costs a response
// (docs/performance.md), so feedback and release are one function with one
// lock acquisition rather than two of each. The unlock is deferred: the
// index's release can panic (shared data is a host call), and a lock left held
// would deadlock the next Decide.
func (r *Dispatcher) end(t *Ticket, cachedTokens int, release bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cachedTokens >= 0 {
		r.stats.FeedbackRequests++
		if t.EnginePromptTokens > 0 && t.promptChars > 0 {
			r.calibrate(t)
		}
		if r.handler.Decode.TrustFeedback {
			// Only Decide under this profile reads the trust it
			// learns: for other profiles the learning would be code
			// entered per response for nothing.
			r.learnTrust(t, cachedTokens)
		}
		if r.ttft != nil && t.TTFTMs > 0 && t.work > 0 {
			r.learnTTFT(t, cachedTokens)
		}
		r.stats.PredictedCachedTokens += uint64(t.PredictedCachedTokens)
		r.stats.ConfirmedCachedTokens += uint64(cachedTokens)
		if d := t.PredictedCachedTokens - cachedTokens; d >= 0 {
			r.stats.PredictionErrorTokens += uint64(d)
		} else {
			r.stats.PredictionErrorTokens += uint64(-d)
		}
		// Engines count hits in their own blocks (16 tokens in vLLM):
		// allow one such block either way.
		const slack = 16
		switch {
		case t.PredictedCachedTokens > cachedTokens+slack:
			r.stats.OverPredicted++
			if r.correct && t.stamp.Blocks > 0 {
				r.correctIndex(t, cachedTokens)
			}
		case t.PredictedCachedTokens+slack < cachedTokens:
			r.stats.UnderPredicted++
		}
	}
	if !release || t.done {
		return
	}
	t.done = true
	r.release(&t.prefill)
	r.release(&t.decode)
}

// maxCalibratedModels bounds the calibration table: a gateway serves a
// handful of models, and a client cannot grow the table by naming more.
const maxCalibratedModels = 256

// loadCal makes model the one whose calibration Decide applies. Out of
// Decide's line (noinline): a gateway's requests mostly name the model the
// previous one named.
//
//go:noinline
func (r *Dispatcher) loadCal(model string) {
	if r.calDirty {
		r.cal[r.calModel] = r.calCPT // the current model's learning, kept in fields meanwhile
		r.calDirty = false
	}
	r.calModel, r.calCPT = model, r.cal[model]
	r.calF = 0
	if r.calCPT > 0 {
		r.calF = r.hashCPT / r.calCPT
	}
}

// calibrate learns t's model's characters per token from the engine's
// usage.prompt_tokens: an EWMA of the prompt's canonical characters over
// them (the first sample taken as is), kept within 1..16. Out of end's line
// (noinline): only responses that carry usage enter it.
//
//go:noinline
func (r *Dispatcher) calibrate(t *Ticket) {
	ratio := float64(t.promptChars) / float64(t.EnginePromptTokens)
	if ratio < 1 {
		ratio = 1
	} else if ratio > 16 {
		ratio = 16
	}
	if t.model == r.calModel && r.calCPT > 0 {
		// The current model, already in the table: no map operation (a
		// few runtime functions each, in Wasm, per response).
		r.calCPT += 0.1 * (ratio - r.calCPT)
		r.calF = r.hashCPT / r.calCPT
		r.calDirty = true
		return
	}
	r.learnCal(t.model, ratio)
}

// learnCal is calibrate for a model other than the current one, or its
// first sample. Out of line: rare.
//
//go:noinline
func (r *Dispatcher) learnCal(model string, ratio float64) {
	c, ok := r.cal[model]
	if !ok && len(r.cal) >= maxCalibratedModels {
		return
	}
	if r.cal == nil {
		r.cal = map[string]float64{}
	}
	if c == 0 {
		c = ratio
	} else {
		c += 0.1 * (ratio - c)
	}
	r.cal[model] = c
	if model == r.calModel {
		r.calCPT, r.calF = c, r.hashCPT/c
	}
}

// DecidedCharsPerToken is the characters per token learned for the model
// of the last decision, 0 while none was: what a gateway reports with the
// route (snapshot.Route.CharsPerToken), so that the metrics service's
// cache-state bridge converts the engine's tokens as this worker does.
func (r *Dispatcher) DecidedCharsPerToken() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calCPT
}

// CharsPerToken returns the characters per token learned for model, or the
// index's fixed estimate when none was.
func (r *Dispatcher) CharsPerToken(model string) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if model == r.calModel && r.calCPT > 0 {
		return r.calCPT
	}
	if c := r.cal[model]; c > 0 {
		return c
	}
	return r.hashCPT
}

// correctIndex tells the index that t's host held only cachedTokens of
// the prefix it predicted (see Config.NoCorrect). Out of end's line
// (noinline): most responses confirm their prediction.
//
//go:noinline
func (r *Dispatcher) correctIndex(t *Ticket, cachedTokens int) {
	// One correction per host per stamp: a correction evicts what the
	// host last used before its stamp, so a later over-prediction whose
	// prediction is no newer (a hot prompt, refreshed at most once per
	// Config.TouchAfterMs) finds nothing more to evict, and each
	// correction costs three shared-data calls.
	slot := t.stampRef.Slot
	for slot >= len(r.corrected) {
		r.corrected = append(r.corrected, index.MatchStamp{})
	}
	if last := r.corrected[slot]; last.Blocks != 0 && !t.stamp.After(last) {
		return
	}
	r.corrected[slot] = t.stamp
	hc := r.ix.Config().Hash
	cpt := r.hashCPT
	if t.model == r.calModel && r.calCPT > 0 {
		cpt = r.calCPT
	} else if c := r.cal[t.model]; c > 0 {
		cpt = c
	}
	confirmed := hc.BlocksIn(int(float64(cachedTokens) * cpt))
	if _, err := r.ix.Correct(t.stampRef, t.stamp, confirmed); err != nil {
		r.stats.IndexErrors++
	}
}

// AppendExplain appends the one-line explanation of the last decision's
// result (res, as Decide returned it) to dst, with the request state the
// dispatcher assembled for it: matched blocks, uncached tokens, per-scorer
// scores. Call it before the next Decide. It never contains prompt text.
func (r *Dispatcher) AppendExplain(dst []byte, res *scorer.Result, hosts []scorer.Host) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	dst = scorer.AppendExplain(dst, &r.req, hosts, &res.Decode)
	if res.Disaggregated {
		dst = append(dst, " | prefill: "...)
		dst = scorer.AppendExplain(dst, &r.req, hosts, &res.Prefill)
	}
	return dst
}
