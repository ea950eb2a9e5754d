package kvevents

import (
	"sync"
	"time"
)

// DefaultMaxBlocks bounds the blocks tracked per host. An engine holds at
// most its num_gpu_blocks (tens of thousands to a few million); a publisher
// that only stores and never removes must not grow this process without end.
const DefaultMaxBlocks = 1 << 22

type blockKey struct {
	medium string
	group  int
	hash   BlockHash
}

// Stats counts what a Tracker saw, for the service's /metrics.
type Stats struct {
	Batches       uint64 // batches applied
	Events        uint64 // events applied, all kinds
	Unknown       uint64 // events with an unknown type tag (skipped)
	Clears        uint64 // AllBlocksCleared events
	Gaps          uint64 // sequence gaps left after any replay
	MissedBatches uint64 // batches lost in those gaps
	Replayed      uint64 // missed batches recovered from the replay socket
	Restarts      uint64 // sequence went backwards: publisher restarted
	DecodeErrors  uint64 // messages that could not be decoded
	Overflow      uint64 // stores dropped because MaxBlocks was reached
}

// Tracker holds one engine's cached blocks as reported by its KV events.
// It is safe for concurrent use: the subscriber writes, the snapshot
// assembler reads.
type Tracker struct {
	// MaxBlocks caps the tracked blocks (DefaultMaxBlocks when zero).
	MaxBlocks int

	mu        sync.Mutex
	blocks    map[blockKey]struct{}
	gpu       int // blocks on the GPU medium (or no medium given)
	haveSeq   bool
	lastSeq   uint64
	clearedAt time.Time
	stats     Stats
}

// SeqResult says how a batch's sequence number related to the previous one.
type SeqResult struct {
	First     bool   // first batch seen from this publisher
	Missed    uint64 // batches lost before this one (a gap when > 0)
	Restarted bool   // the sequence went backwards
}

func isGPU(medium string) bool { return medium == "GPU" }

// normMedium treats "no medium given" as the GPU, as vLLM does.
func normMedium(m string) string {
	if m == "" {
		return "GPU"
	}
	return m
}

// Apply checks seq against the last one seen and applies the batch's
// events. A restarted publisher means a restarted engine, whose cache is
// empty: the tracker clears itself and records the time as a clear.
func (t *Tracker) Apply(seq uint64, b Batch, now time.Time) SeqResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	res := t.checkSeq(seq)
	if res.Restarted {
		t.clearLocked(now)
	}
	t.stats.Batches++
	for i := range b.Events {
		t.applyLocked(&b.Events[i], now)
	}
	return res
}

// Next returns the sequence number expected next; ok is false before the
// first batch.
func (t *Tracker) Next() (next uint64, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lastSeq + 1, t.haveSeq
}

// Replayed counts a batch recovered by replay (applied with Apply as well).
func (t *Tracker) Replayed() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stats.Replayed++
}

// DecodeFailed records a message that could not be decoded. Its sequence
// number still counts, so the next good batch does not look like a gap;
// the failure itself is counted instead.
func (t *Tracker) DecodeFailed(seq uint64, haveSeq bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stats.DecodeErrors++
	if haveSeq {
		t.checkSeq(seq)
	}
}

func (t *Tracker) checkSeq(seq uint64) SeqResult {
	var res SeqResult
	switch {
	case !t.haveSeq:
		res.First = true
	case seq > t.lastSeq+1:
		res.Missed = seq - t.lastSeq - 1
		t.stats.Gaps++
		t.stats.MissedBatches += res.Missed
	case seq <= t.lastSeq:
		res.Restarted = true
		t.stats.Restarts++
	}
	t.haveSeq = true
	t.lastSeq = seq
	return res
}

func (t *Tracker) applyLocked(ev *Event, now time.Time) {
	t.stats.Events++
	ev.Medium = normMedium(ev.Medium)
	if t.blocks == nil {
		t.blocks = make(map[blockKey]struct{})
	}
	switch ev.Kind {
	case BlockStored:
		limit := t.MaxBlocks
		if limit <= 0 {
			limit = DefaultMaxBlocks
		}
		for _, h := range ev.Hashes {
			k := blockKey{ev.Medium, ev.GroupIdx, h}
			if _, ok := t.blocks[k]; ok {
				continue
			}
			if len(t.blocks) >= limit {
				t.stats.Overflow++
				continue
			}
			t.blocks[k] = struct{}{}
			if isGPU(ev.Medium) {
				t.gpu++
			}
		}
	case BlockRemoved:
		for _, h := range ev.Hashes {
			k := blockKey{ev.Medium, ev.GroupIdx, h}
			if _, ok := t.blocks[k]; !ok {
				continue
			}
			delete(t.blocks, k)
			if isGPU(ev.Medium) {
				t.gpu--
			}
		}
	case AllBlocksCleared:
		t.stats.Clears++
		t.clearLocked(now)
	default:
		t.stats.Unknown++
	}
}

func (t *Tracker) clearLocked(now time.Time) {
	clear(t.blocks)
	t.gpu = 0
	t.clearedAt = now
}

// CachedBlocks is the number of GPU blocks the engine reported stored and
// not removed since the last clear.
func (t *Tracker) CachedBlocks() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.gpu
}

// Has reports whether the engine holds the GPU block with this hash (group 0).
func (t *Tracker) Has(h BlockHash) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.blocks[blockKey{"GPU", 0, h}]
	return ok
}

// ClearedAt is the last AllBlocksCleared (or publisher restart); zero if none.
func (t *Tracker) ClearedAt() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.clearedAt
}

// Stats returns a copy of the counters.
func (t *Tracker) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stats
}
