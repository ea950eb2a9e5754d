package index

// Eviction model.
//
// Engines evict their least recently used KV blocks when full. The index
// mirrors that per host with a usage histogram in shared data (one key per
// slot): the host's tracked units (level-0 blocks; a level-l block weighs
// 2^l) by recency bucket of Config.BucketMs. Record adds the units of new
// blocks to the current bucket and moves refreshed blocks' units from
// their old bucket to it. When the total exceeds the host's capacity, the
// oldest buckets are dropped until it is back at capacity (to the nearest
// bucket, as the engine holds it: see bookUsage) and the host's horizon in
// the slot table advances past them: from then on every reader ignores
// that host's bits in entries last refreshed before the horizon, without
// touching the shards; the bits are dropped when their shard is next
// rewritten.

func (ix *Index) bucketTicks() uint32 {
	b := uint32(ix.cfg.BucketMs >> ageShift)
	if b == 0 {
		b = 1
	}
	return b
}

// bookUsage applies ix.pending to ref's usage histogram and evicts past
// the host's capacity. extra > 0 also evicts at least that many of the
// oldest units (Correct), from buckets that start no later than limit. It
// reports whether the horizon moved.
func (ix *Index) bookUsage(ref HostRef, now uint32, extra, limit uint32) (bool, error) {
	key := ix.usageKeys[ref.Slot]
	bt := ix.bucketTicks()
	nowB := now / bt
	rec := ix.table.recs[ref.Slot]
	for attempt := 0; attempt < ix.cfg.CASRetries; attempt++ {
		v, cas, found := ix.getInto(&ix.usageBuf, key)
		// The histogram is edited in place in the value read: a
		// request touches a few buckets of 256, and decoding and encoding
		// all of them cost more than the shared-data round trip in Wasm.
		var head, total uint32
		if found && len(v) == usageHeader+4*usageBuckets && v[0] == usageMagic0 && v[1] == usageMagic1 && v[2] == formatVersion &&
			le.Uint32(v[4:]) == rec.gen && le.Uint32(v[8:]) == rec.clearEpoch {
			head = le.Uint32(v[12:])
			// Sum rather than trust the stored total: a value that passed
			// the header checks may still be inconsistent.
			for i := usageHeader; i < len(v); i += 4 {
				total += le.Uint32(v[i:])
			}
		} else {
			if found && (len(v) < 12 || v[0] != usageMagic0 || v[1] != usageMagic1 || v[2] != formatVersion) {
				ix.metrics.Corrupt++
			}
			if cap(v) < usageHeader+4*usageBuckets {
				v = make([]byte, usageHeader+4*usageBuckets)
				ix.usageBuf = v
			}
			v = v[:usageHeader+4*usageBuckets]
			clear(v)
			head = nowB
		}
		u := usageView(v[usageHeader:])
		head = u.advance(head, nowB)
		tail := head - usageBuckets + 1
		for _, d := range ix.pending {
			b := d.bucket
			if int32(b-tail) < 0 {
				b = tail
			} else if int32(b-head) > 0 {
				b = head
			}
			c := u.get(b)
			if d.units >= 0 {
				c += uint32(d.units)
				total += uint32(d.units)
			} else {
				sub := min(uint32(-d.units), c)
				c -= sub
				total -= sub
			}
			u.put(b, c)
		}
		var horizon uint32
		var evicted uint64
		for b, left := tail, extra; b != head && left > 0; b++ {
			end := (b + 1) * bt
			if int32(b*bt-limit) > 0 { // the bucket starts after limit
				break
			}
			c := u.get(b)
			if c == 0 {
				continue
			}
			left -= min(left, c)
			total -= c
			evicted += uint64(c)
			u.put(b, 0)
			horizon = max(end, 1)
		}
		if rec.capacity > 0 && total > rec.capacity {
			// Evict the oldest buckets down to capacity, to the nearest
			// bucket: drop one only while more than half of its units lie
			// past capacity. The engine frees blocks one at a time (a
			// request's tail before its head) and stays full, so the
			// bucket straddling capacity is one it holds in part, and
			// rounding keeps the count the index believes centred on what
			// the engine holds. Dropping it whole, or evicting below
			// capacity, leaves the index holding less than the engine on
			// average: with long prompts one bucket can hold 10-15% of
			// an engine's memory (TestEvictionTracksExactLRU). Each drop
			// moves the horizon (a slot table write): at most about once
			// per bucket of a host's traffic. Never drop the current
			// bucket: a prompt larger than the whole capacity stays until
			// newer traffic pushes it out.
			for b := tail; b != head; b++ {
				c := u.get(b)
				if c == 0 {
					continue
				}
				if 2*uint64(total)-uint64(c) <= 2*uint64(rec.capacity) {
					break
				}
				total -= c
				evicted += uint64(c)
				u.put(b, 0)
				horizon = (b + 1) * bt
				if horizon == 0 {
					horizon = 1
				}
			}
		}
		v[0], v[1], v[2], v[3] = usageMagic0, usageMagic1, formatVersion, 0
		le.PutUint32(v[4:], rec.gen)
		le.PutUint32(v[8:], rec.clearEpoch)
		le.PutUint32(v[12:], head)
		le.PutUint32(v[16:], total)
		retry, err := ix.set(key, v, cas)
		if retry {
			continue
		}
		if err != nil {
			return false, err
		}
		if horizon != 0 {
			ix.metrics.Evictions += evicted
			return true, ix.raiseHorizon(ref, horizon)
		}
		return false, nil
	}
	ix.metrics.CASFailures++
	return false, ErrContended
}

// usageView is a histogram's counters in place: bucket b lives at
// b % usageBuckets.
type usageView []byte

func (u usageView) get(b uint32) uint32    { return le.Uint32(u[4*(b%usageBuckets):]) }
func (u usageView) put(b uint32, c uint32) { le.PutUint32(u[4*(b%usageBuckets):], c) }

// advance moves the histogram's newest bucket to nowB, folding buckets
// that leave the window into the oldest one kept, so no units are lost.
func (u usageView) advance(head, nowB uint32) uint32 {
	steps := int32(nowB - head)
	if steps <= 0 {
		return head
	}
	if steps >= usageBuckets {
		var sum uint32
		for b := uint32(0); b < usageBuckets; b++ {
			sum += u.get(b)
			u.put(b, 0)
		}
		u.put(nowB+1, sum) // the oldest bucket of the new window
		return nowB
	}
	for b := head + 1; b != nowB+1; b++ {
		// Slot b%N holds bucket b-N, which leaves the window: fold it into
		// b-N+1, the new oldest.
		old := u.get(b)
		u.put(b, 0)
		u.put(b+1, u.get(b+1)+old)
	}
	return nowB
}

func (ix *Index) raiseHorizon(ref HostRef, horizon uint32) error {
	return ix.updateSlots(func(t *slotTable) (bool, error) {
		if err := t.check(ref); err != nil {
			return false, err
		}
		r := &t.recs[ref.Slot]
		if r.horizon != 0 && int32(horizon-r.horizon) <= 0 {
			return false, nil
		}
		r.horizon = horizon
		return true, nil
	})
}
