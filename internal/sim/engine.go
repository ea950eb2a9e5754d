// Package sim models one vLLM-like inference engine replica closely enough
// to measure routing: what a router changes is which replica's prefix cache
// a prompt meets and how long it waits there, so the model keeps exactly the
// mechanisms that decide those two things.
//
// The model follows vLLM v1's scheduler:
//   - continuous batching: every step serves the running requests first
//     (one token each in decode, a chunk each in prefill), then admits
//     waiting requests in arrival order while the step's token budget
//     (max_num_batched_tokens) lasts: chunked prefill;
//   - paged KV memory of fixed 16-token blocks with automatic prefix caching:
//     a request's full prompt blocks are identified by a hash chain, blocks
//     nobody references stay cached and are evicted least-recently-freed
//     first;
//   - preemption by recomputation: when a running request needs a block and
//     none is free, the most recently admitted request is evicted back to
//     the waiting queue and starts over;
//   - step time from a roofline cost model (see Profile);
//   - LoRA adapters (Profile.MaxLoRAs > 0): at most MaxLoRAs distinct
//     adapters run in a batch, and a waiting request whose adapter would
//     exceed that is skipped, as vLLM v1's scheduler does; the engine keeps
//     MaxLoRAs adapters in GPU slots (least recently used evicted) and a
//     step that brings in an adapter not in a slot takes
//     Profile.LoRALoadTime longer.
//
// Time is virtual: the engine never sleeps. Step plans one step, applies its
// progress and says how long it takes; the fleet simulator advances a virtual
// clock by that amount and the live HTTP server sleeps it (scaled).
// An Engine is not safe for concurrent use.
package sim

import (
	"errors"
	"slices"
	"time"
)

// Request is one inference request as the engine sees it: token counts and
// the hash chain of its prompt blocks, never text.
type Request struct {
	ID           uint64
	PromptTokens int
	// BlockHashes identifies the prompt's full BlockSize-token blocks:
	// BlockHashes[i] stands for the whole prefix up to the end of block i,
	// so two requests share a cached block only if they share everything
	// before it. Shorter than PromptTokens/BlockSize means the tail is not
	// cacheable.
	BlockHashes []uint64
	MaxTokens   int // output tokens to generate (at least 1)
	// Adapter names the LoRA adapter the request runs with ("" for the
	// base model).
	Adapter string
	// KVTransferred says a prefill peer computed the prompt's KV and sent it
	// (disaggregated prefill/decode): the engine recomputes only the last
	// prompt token to get logits, as vLLM's NixlConnector decode side does.
	KVTransferred bool
	Arrival       time.Duration

	// Filled in by the engine.
	CachedTokens int           // prompt tokens found in the prefix cache at first scheduling
	Generated    int           // output tokens produced so far
	FirstToken   time.Duration // virtual time the first output token was sampled
	Finished     time.Duration
	Preemptions  int
	Scheduled    bool // scheduled at least once
}

// Stats is an engine's externally visible state, as vLLM's /metrics shows it.
type Stats struct {
	Waiting, Running int
	KVUsage          float64 // referenced blocks over all blocks
	NumGPUBlocks     int
	BlockSize        int
	// CachedBlocks is the number of blocks registered in the prefix cache
	// (what KV events report as stored and not yet removed).
	CachedBlocks     int
	PrefixQueries    int64 // prompt tokens looked up in the prefix cache
	PrefixHits       int64 // of which found
	Preemptions      int64
	Busy             time.Duration // total step time
	Steps            int64
	PromptTokens     int64
	GenerationTokens int64
	// Adapters lists the LoRA adapters with requests running or waiting,
	// sorted (vllm:lora_requests_info's running and waiting adapters);
	// MaxLoRAs is the profile's slot count (max_lora). LoRALoads counts
	// adapters brought into a GPU slot.
	Adapters  []string
	MaxLoRAs  int
	LoRALoads int64
}

// StepResult is what one step did. Tokens lists requests that sampled an
// output token at the end of the step (their first one if Generated == 1);
// Finished lists those that are done. The slices are reused by the next
// Step call.
type StepResult struct {
	Duration time.Duration
	Tokens   []*Request
	Finished []*Request
}

type seq struct {
	r          *Request
	blocks     []int32
	computed   int // tokens whose KV is computed
	registered int // leading blocks registered in the prefix cache
	// prefillTo is how many tokens must be computed before the next token
	// is sampled: the prompt, plus the tokens already generated when the
	// request was preempted (recomputation rebuilds their KV too).
	prefillTo int
}

// Engine is one replica.
type Engine struct {
	prof     Profile
	kv       *kvCache
	waiting  []*seq // FIFO; preempted requests go back to the front
	running  []*seq
	stats    Stats
	work     []SeqWork
	sched    []*seq
	schedN   []int
	result   StepResult
	infinite bool
	events   []KVEvent // KV events since TakeKVEvents (EnableKVEvents)
	// loras are the adapters in GPU slots, least recently used first.
	loras []string
}

// Option adjusts an Engine.
type Option func(*Engine)

// WithInfiniteKV gives the engine unbounded KV memory (nothing is ever
// evicted or preempted): the setting under which a single replica reaches
// a trace's cache ceiling.
func WithInfiniteKV() Option { return func(e *Engine) { e.infinite = true } }

// NewEngine builds an idle engine for the profile.
func NewEngine(p Profile, opts ...Option) *Engine {
	e := &Engine{prof: p}
	for _, o := range opts {
		o(e)
	}
	n := p.NumGPUBlocks()
	e.kv = newKVCache(n, e.infinite)
	e.stats.NumGPUBlocks = n
	e.stats.BlockSize = p.BlockSize
	return e
}

// ErrTooLong rejects a request that could never fit in KV memory.
var ErrTooLong = errors.New("request needs more KV blocks than the engine has")

// Add queues a request. It fails if the prompt plus output could never fit.
func (e *Engine) Add(r *Request) error {
	if r.PromptTokens < 1 {
		return errors.New("request has no prompt tokens")
	}
	if r.MaxTokens < 1 {
		r.MaxTokens = 1
	}
	if !e.infinite {
		need := (r.PromptTokens + r.MaxTokens + e.prof.BlockSize - 1) / e.prof.BlockSize
		if need > len(e.kv.blocks) {
			return ErrTooLong
		}
	}
	e.waiting = append(e.waiting, &seq{r: r})
	return nil
}

// Idle reports whether the engine has nothing to do.
func (e *Engine) Idle() bool { return len(e.waiting) == 0 && len(e.running) == 0 }

// Stats returns the current state and counters.
func (e *Engine) Stats() Stats {
	s := e.stats
	s.Waiting, s.Running = len(e.waiting), len(e.running)
	s.KVUsage = e.kv.usage()
	s.NumGPUBlocks = len(e.kv.blocks)
	s.CachedBlocks = len(e.kv.byHash)
	s.MaxLoRAs = e.prof.MaxLoRAs
	if e.prof.MaxLoRAs > 0 {
		for _, q := range [2][]*seq{e.running, e.waiting} {
			for _, x := range q {
				if a := x.r.Adapter; a != "" && !slices.Contains(s.Adapters, a) {
					s.Adapters = append(s.Adapters, a)
				}
			}
		}
		slices.Sort(s.Adapters)
	}
	return s
}

// runningAdapter reports whether a running request uses adapter a, and
// counts the distinct adapters running.
func (e *Engine) runningAdapters(a string) (has bool, distinct int) {
	var seen [8]string
	n := 0
	for i, x := range e.running {
		ra := x.r.Adapter
		if ra == "" {
			continue
		}
		if ra == a {
			has = true
		}
		dup := false
		if n < len(seen) {
			dup = slices.Contains(seen[:n], ra)
		} else {
			for _, y := range e.running[:i] {
				if y.r.Adapter == ra {
					dup = true
					break
				}
			}
		}
		if !dup {
			if n < len(seen) {
				seen[n] = ra
			}
			n++
		}
	}
	return has, n
}

// loraBlocked reports whether r must wait for a slot: its adapter is not
// among those running and MaxLoRAs adapters already are.
func (e *Engine) loraBlocked(r *Request) bool {
	if r.Adapter == "" || e.prof.MaxLoRAs <= 0 {
		return false
	}
	has, n := e.runningAdapters(r.Adapter)
	return !has && n >= e.prof.MaxLoRAs
}

// useLoRA marks r's adapter most recently used, bringing it into a GPU
// slot (evicting the least recently used adapter no running request uses)
// when it is not in one. It reports whether it had to load it.
func (e *Engine) useLoRA(a string) bool {
	if a == "" || e.prof.MaxLoRAs <= 0 {
		return false
	}
	if i := slices.Index(e.loras, a); i >= 0 {
		e.loras = append(append(e.loras[:i], e.loras[i+1:]...), a)
		return false
	}
	if len(e.loras) >= e.prof.MaxLoRAs {
		for i, old := range e.loras {
			if has, _ := e.runningAdapters(old); !has {
				e.loras = append(e.loras[:i], e.loras[i+1:]...)
				break
			}
		}
	}
	e.loras = append(e.loras, a)
	e.stats.LoRALoads++
	return true
}

// PeekCached is how many prompt tokens of the chain the prefix cache holds
// right now (a read-only probe, for tests and the ceiling).
func (e *Engine) PeekCached(chain []uint64) int {
	return e.kv.lookup(chain) * e.prof.BlockSize
}

func (e *Engine) blocksFor(tokens int) int {
	return (tokens + e.prof.BlockSize - 1) / e.prof.BlockSize
}

// Step plans and applies one engine step starting at virtual time now. The
// returned Duration is zero when there was nothing to run. Output tokens and
// completions are stamped with now + Duration.
func (e *Engine) Step(now time.Duration) *StepResult {
	res := &e.result
	res.Duration, res.Tokens, res.Finished = 0, res.Tokens[:0], res.Finished[:0]
	e.sched, e.schedN, e.work = e.sched[:0], e.schedN[:0], e.work[:0]
	budget := e.prof.MaxBatchedTokens
	preempted := false

	// Running requests first, in admission order.
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		n := 1
		if s.computed < s.prefillTo {
			n = min(s.prefillTo-s.computed, budget)
		}
		need := e.blocksFor(s.computed+n) - len(s.blocks)
		for need > e.kv.available() {
			// Preempt the most recently admitted request (vLLM's policy).
			victim := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			preempted = true
			if victim == s {
				break
			}
		}
		if i >= len(e.running) || e.running[i] != s {
			break // s itself was preempted
		}
		if need > 0 {
			s.blocks = e.kv.allocate(need, s.blocks)
		}
		e.schedule(s, n)
		budget -= n
	}

	// Then waiting requests, unless memory pressure just forced preemption.
	// A request whose adapter cannot join the batch is skipped, not waited
	// for (vLLM v1 does the same).
	loads := 0
	for w := 0; !preempted && budget > 0 && w < len(e.waiting) && len(e.running) < e.prof.MaxNumSeqs; {
		s := e.waiting[w]
		r := s.r
		if e.loraBlocked(r) {
			w++
			continue
		}
		bs := e.prof.BlockSize
		s.prefillTo = r.PromptTokens + r.Generated
		hit := e.kv.lookup(r.BlockHashes)
		// At least one prompt token is always computed, to get logits.
		if hit*bs >= r.PromptTokens {
			hit = (r.PromptTokens - 1) / bs
		}
		s.blocks = e.kv.acquire(r.BlockHashes, hit, s.blocks[:0])
		s.computed = hit * bs
		s.registered = hit
		var n int
		if r.KVTransferred {
			// The prompt's KV arrives over the wire: hold blocks for all of
			// it, compute only the last token.
			n = 1
			s.computed = max(s.computed, r.PromptTokens-1)
		} else {
			n = min(s.prefillTo-s.computed, budget)
		}
		need := e.blocksFor(s.computed+n) - len(s.blocks)
		if need > e.kv.available() {
			e.kv.release(s.blocks)
			s.blocks = s.blocks[:0]
			s.computed, s.registered = 0, 0
			break
		}
		s.blocks = e.kv.allocate(need, s.blocks)
		if !r.Scheduled {
			r.Scheduled = true
			// Like vLLM's num_cached_tokens: local prefix hits plus KV
			// received from a prefill peer.
			r.CachedTokens = s.computed
			e.stats.PrefixQueries += int64(r.PromptTokens)
			e.stats.PrefixHits += int64(hit * bs)
		}
		if w == 0 {
			e.waiting = e.waiting[1:]
		} else {
			e.waiting = append(e.waiting[:w], e.waiting[w+1:]...)
		}
		if e.useLoRA(r.Adapter) {
			loads++
		}
		e.running = append(e.running, s)
		e.schedule(s, n)
		budget -= n
	}

	if len(e.sched) == 0 {
		return res
	}
	res.Duration = e.prof.StepTime(e.work) + time.Duration(loads)*e.prof.LoRALoadTime
	end := now + res.Duration
	e.stats.Busy += res.Duration
	e.stats.Steps++

	// Apply the step's progress.
	for k, s := range e.sched {
		n := e.schedN[k]
		r := s.r
		wasPrefill := s.computed < s.prefillTo
		s.computed += n
		if wasPrefill {
			e.stats.PromptTokens += int64(n)
			e.registerFull(s)
		}
		if s.computed >= s.prefillTo {
			r.Generated++
			e.stats.GenerationTokens++
			if r.Generated == 1 {
				r.FirstToken = end
			}
			res.Tokens = append(res.Tokens, r)
			if r.Generated >= r.MaxTokens {
				r.Finished = end
				res.Finished = append(res.Finished, r)
			}
		}
	}
	if len(res.Finished) > 0 {
		kept := e.running[:0]
		for _, s := range e.running {
			if s.r.Generated >= s.r.MaxTokens && s.computed >= s.prefillTo {
				e.kv.release(s.blocks)
				s.blocks = nil
				continue
			}
			kept = append(kept, s)
		}
		for i := len(kept); i < len(e.running); i++ {
			e.running[i] = nil
		}
		e.running = kept
	}
	return res
}

func (e *Engine) schedule(s *seq, n int) {
	e.sched = append(e.sched, s)
	e.schedN = append(e.schedN, n)
	e.work = append(e.work, SeqWork{Context: s.computed, NewTokens: n})
}

// registerFull publishes the sequence's newly completed prompt blocks in the
// prefix cache. With KV events on, each run of newly cached blocks is one
// BlockStored whose parent is the block before the run, as vLLM reports
// them.
func (e *Engine) registerFull(s *seq) {
	full := min(s.computed/e.prof.BlockSize, len(s.r.BlockHashes), len(s.blocks))
	run := -1 // index of the open BlockStored in e.events
	for ; s.registered < full; s.registered++ {
		i := s.registered
		h := s.r.BlockHashes[i]
		if !e.kv.register(s.blocks[i], h) {
			run = -1
			continue
		}
		if e.kv.events == nil {
			continue
		}
		if run < 0 {
			ev := KVEvent{Kind: KVStored, BlockSize: e.prof.BlockSize}
			if i > 0 {
				ev.Parent, ev.HasParent = s.r.BlockHashes[i-1], true
			}
			e.events = append(e.events, ev)
			run = len(e.events) - 1
		}
		e.events[run].Hashes = append(e.events[run].Hashes, h)
	}
}

// KVEventKind is the type of a KVEvent.
type KVEventKind uint8

const (
	KVStored KVEventKind = iota
	KVRemoved
)

// KVEvent is one change of the prefix cache as vLLM publishes it: blocks
// stored (with the block before them, their parent) or evicted. Hashes are
// the engine's own block hashes (Request.BlockHashes).
type KVEvent struct {
	Kind      KVEventKind
	Hashes    []uint64
	Parent    uint64
	HasParent bool
	BlockSize int
}

// EnableKVEvents makes the engine log its prefix cache's changes for
// TakeKVEvents, as vLLM does with --kv-events-config. Off by default: the
// log costs an allocation per stored run.
func (e *Engine) EnableKVEvents() {
	if e.kv.events == nil {
		e.kv.events = &e.events
	}
}

// TakeKVEvents returns the events logged since the last call, oldest
// first, and starts a new log. The slice is the caller's.
func (e *Engine) TakeKVEvents() []KVEvent {
	ev := e.events
	e.events = nil
	return ev
}

func (e *Engine) preempt(s *seq) {
	e.kv.release(s.blocks)
	s.blocks = s.blocks[:0]
	s.computed, s.registered = 0, 0
	s.r.Preemptions++
	e.stats.Preemptions++
	// Generated tokens are kept (they were streamed); on readmission the
	// prompt and those tokens are recomputed (prefillTo).
	e.waiting = append(e.waiting, nil)
	copy(e.waiting[1:], e.waiting)
	e.waiting[0] = s
}

// Abort drops a request that is waiting or running (its client went away),
// releasing its KV blocks; its computed prompt blocks stay cached. It
// reports whether the request was found.
func (e *Engine) Abort(r *Request) bool {
	for i, s := range e.waiting {
		if s.r == r {
			e.kv.release(s.blocks)
			e.waiting = append(e.waiting[:i], e.waiting[i+1:]...)
			return true
		}
	}
	for i, s := range e.running {
		if s.r == r {
			e.kv.release(s.blocks)
			e.running = append(e.running[:i], e.running[i+1:]...)
			return true
		}
	}
	return false
}
