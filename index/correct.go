package index

// MatchStamp is what Correct needs from a Query answer for one host: the
// blocks the index predicted and the recency of the last of them, taken
// before Record refreshed it. Keep it with the request (it is small).
type MatchStamp struct {
	Blocks int
	age    uint32
}

// After reports whether s's last block was refreshed later than o's.
func (s MatchStamp) After(o MatchStamp) bool { return int32(s.age-o.age) > 0 }

// Stamp returns slot's MatchStamp from this Query answer.
func (m *Matches) Stamp(slot int) MatchStamp {
	if slot < 0 || slot >= len(m.Blocks) || m.Blocks[slot] == 0 {
		return MatchStamp{}
	}
	return MatchStamp{Blocks: m.Blocks[slot], age: m.ages[slot]}
}

// Correct closes the loop with the engine's own count of cached prompt
// tokens (usage.prompt_tokens_details.cached_tokens, converted to blocks
// by the caller with the Hasher). When the engine held fewer blocks than
// the index predicted, it had evicted blocks confirmedBlocks..Blocks-1,
// which the index still counted: the host's usage was under-counted by at
// least their units. Correct evicts that many of the host's oldest units
// (moving its horizon), and only units last refreshed no later than the
// stamped block, since under LRU nothing newer can have gone first. Blocks
// recorded since (this request's own) stay counted. It reports whether
// the horizon moved.
func (ix *Index) Correct(ref HostRef, stamp MatchStamp, confirmedBlocks int) (bool, error) {
	if stamp.Blocks == 0 || confirmedBlocks >= stamp.Blocks {
		return false, nil
	}
	confirmedBlocks = max(confirmedBlocks, 0)
	var missing uint32
	for i := confirmedBlocks; i < stamp.Blocks; i++ {
		missing += 1 << ix.level(i)
	}
	ix.readSlots()
	if err := ix.table.check(ref); err != nil {
		return false, err
	}
	ix.pending = ix.pending[:0]
	moved, err := ix.bookUsage(ref, ix.nowAge(), missing, stamp.age)
	if moved {
		ix.metrics.Corrections++
	}
	return moved, err
}
