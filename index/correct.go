package index

// MatchStamp is what Correct needs from a Query answer for one host: the
// blocks the index predicted and the recency of the last of them, taken
// before Record refreshed it. Keep it with the request (it is small).
type MatchStamp struct {
	Blocks int
	age    uint32
}

// Stamp returns slot's MatchStamp from this Query answer.
func (m *Matches) Stamp(slot int) MatchStamp {
	if slot < 0 || slot >= len(m.Blocks) || m.Blocks[slot] == 0 {
		return MatchStamp{}
	}
	return MatchStamp{Blocks: m.Blocks[slot], age: m.ages[slot]}
}

// Correct closes the loop with the engine's own count of cached prompt
// tokens (usage.prompt_tokens_details.cached_tokens, converted to blocks
// by the caller with the Hasher): when the engine held fewer blocks than
// the index predicted, the host evicted block confirmedBlocks of the
// chain, last refreshed at or after the stamped block. Engines evict least
// recently used first, so everything of this host refreshed no later than
// the stamped block is gone too: Correct raises the host's horizon past
// it. Blocks recorded since (this request's own) stay counted.
//
// The stamp's age is the entry's, shared by every host holding the block:
// when another host refreshed it more recently, the horizon moves further
// than the engine evicted, and the host under-reports until new requests
// re-record its blocks (conservative: fewer affinity decisions, never a
// wrong one). It reports whether the horizon moved.
func (ix *Index) Correct(ref HostRef, stamp MatchStamp, confirmedBlocks int) (bool, error) {
	if stamp.Blocks == 0 || confirmedBlocks >= stamp.Blocks {
		return false, nil
	}
	horizon := stamp.age + 1
	if horizon == 0 {
		horizon = 1
	}
	// Never past now: this request's own blocks were recorded at now.
	if now := ix.nowAge(); int32(horizon-now) > 0 {
		horizon = now
	}
	moved := false
	err := ix.updateSlots(func(t *slotTable) (bool, error) {
		if err := t.check(ref); err != nil {
			return false, err
		}
		r := &t.recs[ref.Slot]
		if r.horizon != 0 && int32(horizon-r.horizon) <= 0 {
			return false, nil
		}
		r.horizon = horizon
		moved = true
		return true, nil
	})
	if moved {
		ix.metrics.Corrections++
	}
	return moved, err
}
