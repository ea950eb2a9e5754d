// Package cachestate bridges an engine's KV events into kvroute's own
// block-hash space, so the engines' real cache state can correct the
// gateways' index without a tokenizer anywhere.
//
// kvroute hashes characters (index.Hasher: blocks of a few hundred bytes,
// doubling along the chain); an engine hashes tokens (vLLM: 16-token
// blocks). The two never meet by value. They meet by correlation, in the
// metrics service, which sees both sides of one engine H:
//   - the gateways' routing: request r, with kvroute chain C, went to H
//     (Route);
//   - H's BlockStored batches: engine blocks e_1..e_n stored after parent
//     p, each standing for a prefix of d x block_size tokens.
//
// A BlockStored is attributed to the oldest pending route of H whose chain
// agrees with the parent's chain at the parent's depth (the engine stores
// only blocks it did not hold, so a route whose prefix was cached starts
// at that prefix's last block) and whose prompt reaches the new blocks.
// Each engine hash then maps to (chain, depth) in a table the Bridge keeps
// (llm-d's dual key, kept on the service side). A BlockRemoved of engine
// block at depth d means H no longer holds kvroute blocks past the first
// d-1 engine blocks' tokens: the Bridge emits a Delta removing that
// chain's blocks from there on, which every gateway applies to its index
// (index.Removed). AllBlocksCleared clears the table and the host.
//
// The depth conversion: engine depth d covers d x block_size tokens;
// kvroute blocks have fixed character sizes by position, so the kvroute
// blocks held are those whose end lies within d x block_size x
// CharsPerToken characters (HashConfig.BlocksIn). docs/cache-state.md
// states the error bounds.
//
// A Bridge serves one engine and is not safe for concurrent use.
package cachestate

import (
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/metricsvc/kvevents"
)

// Delta is one change to a host's blocks in kvroute's hash space.
type Delta struct {
	Kind DeltaKind
	// Chain is the chain from its first block (a block's shard and weight
	// depend on its position); the change covers Chain[From:].
	Chain []uint64
	From  int
}

// DeltaKind says what a Delta does.
type DeltaKind uint8

const (
	// Stored: the host holds Chain[From:] (index.Stored).
	Stored DeltaKind = iota
	// Removed: the host no longer holds Chain[From:] (index.Removed).
	Removed
	// Cleared: the host holds nothing (index.Clear); Chain is empty.
	Cleared
)

// Stats counts what a Bridge did.
type Stats struct {
	Routes     uint64 // routes reported
	Expired    uint64 // routes that waited past Window without all their blocks
	Matched    uint64 // BlockStored events attributed to a route
	Unmatched  uint64 // BlockStored events attributed to none (their blocks stay unmapped)
	Removed    uint64 // engine blocks removed that mapped to a chain
	Unmapped   uint64 // engine blocks removed that mapped to none
	Clears     uint64
	MappedNow  int // engine blocks mapped at present
	PendingNow int // routes waiting for their blocks at present
}

// Bridge correlates one engine's events with the routes sent to it.
type Bridge struct {
	// Hash is kvroute's block layout (the gateways' index configuration).
	Hash index.HashConfig
	// CharsPerToken converts engine tokens to kvroute characters; 0 takes
	// Hash.CharsPerToken. Set it from the model's calibration (usage
	// prompt_tokens against the canonical prompt length).
	CharsPerToken float64
	// BlockSize is the engine's tokens per block when its events do not
	// say (llm-d-inference-sim sends 0); from vllm:cache_config_info.
	BlockSize int
	// WindowMs bounds how long a route waits for its blocks (default
	// 30 s); MaxPending bounds the routes waiting (default 4096).
	WindowMs   int64
	MaxPending int

	pending []*route
	nodes   map[kvevents.BlockHash]node
	// held counts, per kvroute block hash, the mapped engine blocks that
	// complete it: the engine holds that kvroute block (whatever route
	// stored it), so a route whose next block it is would have hit it.
	held    map[uint64]int32
	stats   Stats
	removed []removal // scratch: per chain, the lowest depth one event removed
}

type removal struct {
	r    *route
	from int
}

type route struct {
	chain    []uint64
	at       int64 // ms
	chars    int   // canonical characters of the prompt
	storedTo int   // engine blocks of this route stored so far (its frontier)
	done     bool
}

type node struct {
	r     *route
	depth int32 // engine blocks from the start of the prompt, this one included
	bs    int32 // the engine's block size when stored
	kv    int32 // kvroute depth this block completes (0: none)
}

// Route reports that a request was sent to this engine at nowMs: its
// kvroute chain (copied) and its prompt's canonical length in characters
// (index.Hasher.Len: the chain covers only whole blocks, the engine stores
// blocks up to the prompt's end).
func (b *Bridge) Route(chain []uint64, promptChars int, nowMs int64) {
	if len(chain) == 0 {
		return
	}
	b.expire(nowMs)
	chars := 0
	for i := range chain {
		chars += b.Hash.BlockSizeAt(i)
	}
	b.pending = append(b.pending, &route{chain: append([]uint64(nil), chain...), at: nowMs, chars: max(chars, promptChars)})
	b.stats.Routes++
	if limit := b.maxPending(); len(b.pending) > limit {
		b.drop(len(b.pending) - limit)
	}
}

func (b *Bridge) hash() index.HashConfig { return b.Hash.WithDefaults() }

func (b *Bridge) maxPending() int {
	if b.MaxPending > 0 {
		return b.MaxPending
	}
	return 4096
}

func (b *Bridge) cpt() float64 {
	if b.CharsPerToken > 0 {
		return b.CharsPerToken
	}
	return float64(b.hash().CharsPerToken)
}

// depth is the kvroute depth whose blocks lie within an engine prefix of
// tokens tokens.
func (b *Bridge) depth(tokens int) int {
	return b.hash().BlocksIn(int(float64(tokens) * b.cpt()))
}

func (b *Bridge) expire(nowMs int64) {
	w := b.WindowMs
	if w <= 0 {
		w = 30000
	}
	n := 0
	for n < len(b.pending) && (b.pending[n].done || nowMs-b.pending[n].at > w) {
		if !b.pending[n].done {
			b.stats.Expired++
		}
		n++
	}
	b.drop(n)
}

func (b *Bridge) drop(n int) {
	if n <= 0 {
		return
	}
	clear(b.pending[:n])
	b.pending = append(b.pending[:0], b.pending[n:]...)
}

// Apply reads one batch of the engine's events and appends the deltas it
// implies to dst.
func (b *Bridge) Apply(batch kvevents.Batch, nowMs int64, dst []Delta) []Delta {
	if b.nodes == nil {
		b.nodes = map[kvevents.BlockHash]node{}
		b.held = map[uint64]int32{}
	}
	b.expire(nowMs)
	for i := range batch.Events {
		ev := &batch.Events[i]
		if ev.GroupIdx != 0 || ev.Medium != "" && ev.Medium != "GPU" {
			continue // another KV group, or CPU offload: not the GPU prefix cache
		}
		switch ev.Kind {
		case kvevents.BlockStored:
			dst = b.stored(ev, dst)
		case kvevents.BlockRemoved:
			for _, h := range ev.Hashes {
				n, ok := b.nodes[h]
				if !ok {
					b.stats.Unmapped++
					continue
				}
				delete(b.nodes, h)
				b.stats.Removed++
				if n.kv > 0 {
					k := n.r.chain[n.kv-1]
					if b.held[k]--; b.held[k] <= 0 {
						delete(b.held, k)
					}
				}
				b.noteRemoved(n.r, b.depth(int(n.depth-1)*int(n.bs)))
			}
			// Flush at the end of the event so stores and removals keep
			// their order.
			dst = b.flushRemoved(dst)
		case kvevents.AllBlocksCleared:
			clear(b.nodes)
			clear(b.held)
			b.stats.Clears++
			dst = append(dst, Delta{Kind: Cleared})
		}
	}
	return dst
}

// noteRemoved keeps the lowest depth removed from r's chain by the event
// being read: the engine evicts a prompt's blocks tail first, one event
// naming many of them, and one Delta per chain covers them all.
func (b *Bridge) noteRemoved(r *route, from int) {
	for i := range b.removed {
		if b.removed[i].r == r {
			b.removed[i].from = min(b.removed[i].from, from)
			return
		}
	}
	b.removed = append(b.removed, removal{r, from})
}

func (b *Bridge) flushRemoved(dst []Delta) []Delta {
	for _, x := range b.removed {
		if x.from < len(x.r.chain) {
			dst = append(dst, Delta{Kind: Removed, Chain: x.r.chain, From: x.from})
		}
	}
	clear(b.removed)
	b.removed = b.removed[:0]
	return dst
}

func (b *Bridge) stored(ev *kvevents.Event, dst []Delta) []Delta {
	if len(ev.Hashes) == 0 {
		return dst
	}
	bs := ev.BlockSize
	if bs <= 0 && ev.Tokens > 0 {
		bs = ev.Tokens / len(ev.Hashes)
	}
	if bs <= 0 {
		bs = b.BlockSize
	}
	if bs <= 0 {
		b.stats.Unmatched++
		return dst
	}
	parentDepth := 0
	var parent *route
	if ev.Parent != "" {
		pn, ok := b.nodes[ev.Parent]
		if !ok {
			b.stats.Unmatched++ // its parent was never mapped: nothing to anchor to
			return dst
		}
		parentDepth, parent = int(pn.depth), pn.r
	}
	r := b.match(parent, parentDepth, len(ev.Hashes), bs)
	if r == nil {
		b.stats.Unmatched++
		return dst
	}
	b.stats.Matched++
	prev := b.depth(parentDepth * bs)
	for i, h := range ev.Hashes {
		d := parentDepth + i + 1
		n := node{r: r, depth: int32(d), bs: int32(bs)}
		if k := min(b.depth(d*bs), len(r.chain)); k > prev {
			n.kv = int32(k)
			b.held[r.chain[k-1]]++
			prev = k
		}
		if old, ok := b.nodes[h]; ok && old.kv > 0 {
			// Stored again (vLLM does not; be safe): drop the old count.
			k := old.r.chain[old.kv-1]
			if b.held[k]--; b.held[k] <= 0 {
				delete(b.held, k)
			}
		}
		b.nodes[h] = n
	}
	end := parentDepth + len(ev.Hashes)
	r.storedTo = end
	if float64((end+1)*bs)*b.cpt() > float64(r.chars) {
		r.done = true // no further full block of its prompt to come
	}
	from, to := b.depth(parentDepth*bs), min(b.depth(end*bs), len(r.chain))
	if from < to {
		dst = append(dst, Delta{Kind: Stored, Chain: r.chain[:to], From: from})
	}
	return dst
}

// match finds the route a BlockStored of n blocks after an engine prefix
// of parentDepth blocks (held for parent's chain) belongs to: the oldest
// pending one that continues there, agrees with parent's chain over the
// kvroute blocks that prefix covers, whose prompt reaches the last new
// block, and whose next kvroute block the engine does not already hold
// (else its cache hit went further and it stores elsewhere).
func (b *Bridge) match(parent *route, parentDepth, n, bs int) *route {
	kd := b.depth(parentDepth * bs)
	// The last new block starts inside the prompt (a block's worth of
	// slack for the characters-per-token estimate).
	need := float64((parentDepth+n-1)*bs) * b.cpt()
	for _, r := range b.pending {
		if r.done || r.storedTo != 0 && r.storedTo != parentDepth {
			continue
		}
		if float64(r.chars) <= need {
			continue
		}
		if parent != nil && kd > 0 {
			if len(r.chain) < kd || len(parent.chain) < kd || r.chain[kd-1] != parent.chain[kd-1] {
				continue
			}
		}
		if parent == nil && r.storedTo != 0 {
			continue
		}
		// The engine already holds r's next kvroute block: r hit it and
		// stores from further on, so these blocks are another request's.
		if r.storedTo == 0 && kd < len(r.chain) && b.held[r.chain[kd]] > 0 {
			continue
		}
		return r
	}
	return nil
}

// Mapped reports whether engine block h maps to a route's chain.
func (b *Bridge) Mapped(h kvevents.BlockHash) bool {
	_, ok := b.nodes[h]
	return ok
}

// Add adds o's counters to s (a fleet's bridges).
func (s *Stats) Add(o Stats) {
	s.Routes += o.Routes
	s.Expired += o.Expired
	s.Matched += o.Matched
	s.Unmatched += o.Unmatched
	s.Removed += o.Removed
	s.Unmapped += o.Unmapped
	s.Clears += o.Clears
	s.MappedNow += o.MappedNow
	s.PendingNow += o.PendingNow
}

// Stats returns the counters.
func (b *Bridge) Stats() Stats {
	s := b.stats
	s.MappedNow = len(b.nodes)
	s.PendingNow = len(b.pending)
	return s
}
