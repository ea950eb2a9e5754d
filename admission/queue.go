package admission

import "sort"

// Item is one held request. ID is the caller's handle (a stream context id,
// a workload index); the queue never interprets it.
type Item struct {
	ID         uint64
	Class      Class
	DeadlineMs int64
	HeldAtMs   int64
	seq        uint64
}

// before reports whether a is released before b: higher class, then earlier
// deadline, then earlier arrival.
func (a *Item) before(b *Item) bool {
	if a.Class != b.Class {
		return a.Class > b.Class
	}
	if a.DeadlineMs != b.DeadlineMs {
		return a.DeadlineMs < b.DeadlineMs
	}
	return a.seq < b.seq
}

// Queue is a bounded priority queue of held requests. It is a slice kept
// sorted worst first, so the next release is the last element and the next
// to shed the first: with a few hundred entries per worker an insertion's
// copy costs less than a heap's pointer chasing, and both ends are O(1).
type Queue struct {
	items []Item
	max   int
	seq   uint64
	byID  map[uint64]struct{}
}

// NewQueue returns a queue holding at most max requests.
func NewQueue(max int) *Queue {
	return &Queue{max: max, byID: map[uint64]struct{}{}}
}

// Len is the number of held requests.
func (q *Queue) Len() int { return len(q.items) }

// Push holds it. When the queue is full, it takes the place of the worst
// held request if it ranks above it (shed is that request, ok true);
// otherwise nothing changes and ok is false (overflow: refuse it).
func (q *Queue) Push(it Item) (shed Item, evicted, ok bool) {
	q.seq++
	it.seq = q.seq
	if len(q.items) >= q.max {
		if len(q.items) == 0 || !it.before(&q.items[0]) {
			return Item{}, false, false
		}
		shed, evicted = q.items[0], true
		delete(q.byID, shed.ID)
		q.items = append(q.items[:0], q.items[1:]...)
	}
	// First position whose item ranks above it: everything before is worse.
	i := sort.Search(len(q.items), func(i int) bool { return q.items[i].before(&it) })
	q.items = append(q.items, Item{})
	copy(q.items[i+1:], q.items[i:])
	q.items[i] = it
	q.byID[it.ID] = struct{}{}
	return shed, evicted, true
}

// Peek returns the next request to release.
func (q *Queue) Peek() (Item, bool) {
	if len(q.items) == 0 {
		return Item{}, false
	}
	return q.items[len(q.items)-1], true
}

// Pop removes and returns the next request to release.
func (q *Queue) Pop() (Item, bool) {
	it, ok := q.Peek()
	if ok {
		q.items = q.items[:len(q.items)-1]
		delete(q.byID, it.ID)
	}
	return it, ok
}

// Remove drops the request with id (its client went away); it reports
// whether it was held.
func (q *Queue) Remove(id uint64) (Item, bool) {
	if _, ok := q.byID[id]; !ok {
		return Item{}, false
	}
	for i := range q.items {
		if q.items[i].ID == id {
			it := q.items[i]
			q.items = append(q.items[:i], q.items[i+1:]...)
			delete(q.byID, id)
			return it, true
		}
	}
	return Item{}, false
}

// Holds reports whether id is held.
func (q *Queue) Holds(id uint64) bool { _, ok := q.byID[id]; return ok }

// Expire removes every request whose deadline is at or before nowMs,
// appending them to out.
func (q *Queue) Expire(nowMs int64, out []Item) []Item {
	kept := q.items[:0]
	for _, it := range q.items {
		if it.DeadlineMs <= nowMs {
			out = append(out, it)
			delete(q.byID, it.ID)
			continue
		}
		kept = append(kept, it)
	}
	q.items = kept
	return out
}

// ByBand counts held requests per class band (Bands order).
func (q *Queue) ByBand() (n [3]int) {
	for i := range q.items {
		n[q.items[i].Class.Band()]++
	}
	return n
}

// MaxClass is the highest class held (ok false when empty).
func (q *Queue) MaxClass() (Class, bool) {
	it, ok := q.Peek()
	return it.Class, ok
}
