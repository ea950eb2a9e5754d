package admission

import (
	"container/heap"
	"math/rand/v2"
	"strconv"
	"testing"
)

// The held queue is a sorted slice (O(n) insertion, O(1) at both ends).
// The baseline is container/heap with the same order, which has O(log n)
// insertion but needs a linear scan to find the worst item to shed.
// Workload: a queue kept at depth items, each step one push (shedding the
// worst when full) and one pop, random classes and deadlines.

type itemHeap []Item

func (h itemHeap) Len() int           { return len(h) }
func (h itemHeap) Less(i, j int) bool { return h[i].before(&h[j]) }
func (h itemHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *itemHeap) Push(x any)        { *h = append(*h, x.(Item)) }
func (h *itemHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

func benchItems(n int) []Item {
	rng := rand.New(rand.NewPCG(1, 2))
	items := make([]Item, n)
	for i := range items {
		items[i] = Item{ID: uint64(i), Class: Class(rng.IntN(10)), DeadlineMs: rng.Int64N(100_000), seq: uint64(i)}
	}
	return items
}

func benchDepths(b *testing.B, run func(b *testing.B, depth int)) {
	for _, depth := range []int{16, 256, 4096} {
		b.Run("depth="+strconv.Itoa(depth), func(b *testing.B) { run(b, depth) })
	}
}

func BenchmarkQueueSortedSlice(b *testing.B) {
	benchDepths(b, func(b *testing.B, depth int) {
		items := benchItems(1 << 14)
		q := NewQueue(depth)
		for i := 0; i < depth; i++ {
			q.Push(items[i])
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			q.Push(items[i&(len(items)-1)])
			q.Pop()
			if q.Len() < depth-1 {
				q.Push(items[(i+7)&(len(items)-1)])
			}
		}
	})
}

func BenchmarkQueueHeapBaseline(b *testing.B) {
	benchDepths(b, func(b *testing.B, depth int) {
		items := benchItems(1 << 14)
		h := &itemHeap{}
		for i := 0; i < depth; i++ {
			heap.Push(h, items[i])
		}
		push := func(it Item) {
			if h.Len() >= depth {
				// Shed the worst: a linear scan over the leaves.
				w := h.Len() / 2
				for j := w + 1; j < h.Len(); j++ {
					if (*h)[w].before(&(*h)[j]) {
						w = j
					}
				}
				if !it.before(&(*h)[w]) {
					return
				}
				heap.Remove(h, w)
			}
			heap.Push(h, it)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			push(items[i&(len(items)-1)])
			heap.Pop(h)
			if h.Len() < depth-1 {
				push(items[(i+7)&(len(items)-1)])
			}
		}
	})
}
