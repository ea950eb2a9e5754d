package index

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"testing"
)

// lruHost is the reference: one engine's exact LRU over blocks weighted
// like the index's (2^level units), evicting the least recently used and,
// among blocks used at the same time, the later chain positions first (as
// vLLM frees a request's blocks tail first).
type lruHost struct {
	cap   int
	used  int
	touch map[uint64]lruItem
	heap  lruHeap
}

type lruItem struct {
	at    int64
	pos   int
	units int
	block uint64
}

type lruHeap []lruItem

func (h lruHeap) Len() int { return len(h) }
func (h lruHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].pos > h[j].pos
}
func (h lruHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *lruHeap) Push(x any)   { *h = append(*h, x.(lruItem)) }
func (h *lruHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (l *lruHost) record(chain []uint64, at int64, units func(int) int) {
	for i, b := range chain {
		it, ok := l.touch[b]
		if !ok {
			l.used += units(i)
		}
		it = lruItem{at: at, pos: i, units: units(i), block: b}
		l.touch[b] = it
		heap.Push(&l.heap, it)
	}
	for l.used > l.cap && l.heap.Len() > 0 {
		it := heap.Pop(&l.heap).(lruItem)
		if cur, ok := l.touch[it.block]; ok && cur == it {
			delete(l.touch, it.block)
			l.used -= it.units
		}
	}
}

func (l *lruHost) match(chain []uint64) int {
	n := 0
	for n < len(chain) {
		if _, ok := l.touch[chain[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// driftStats compares the index's matches with exact per-host LRU.
type driftStats struct {
	pairs, exact, over, under int
	absBlocks, refBlocks      int
}

func (d driftStats) String() string {
	return fmt.Sprintf("exact %.1f%%, over-reported %.1f%%, under-reported %.1f%%, mean |error| %.2f blocks (%.1f%% of matched blocks)",
		100*float64(d.exact)/float64(d.pairs), 100*float64(d.over)/float64(d.pairs), 100*float64(d.under)/float64(d.pairs),
		float64(d.absBlocks)/float64(d.pairs), 100*float64(d.absBlocks)/float64(max(d.refBlocks, 1)))
}

// runDrift replays a Zipf-popular conversation workload on 8 hosts whose
// capacity holds a fraction of the working set, routing each request to
// the host with the longest match (ties random) as kvroute would, and
// compares every host's match for sampled chains with exact LRU.
// driftOpts selects one replay.
type driftOpts struct {
	capFraction float64 // host capacity as a fraction of the working set
	bucketMs    int64   // Config.BucketMs
	evict       bool    // set host capacities (else the index never evicts)
	feedback    bool    // call Correct with the engine's cached blocks
	segment     int     // Config.SegmentBlocks (0: default)
	noHints     bool    // Config.NoQueryHints
}

func runDrift(t testing.TB, seed uint64, o driftOpts) driftStats {
	capFraction, bucketMs, evict, feedback := o.capFraction, o.bucketMs, o.evict, o.feedback
	rng := rand.New(rand.NewPCG(seed, 3))
	clk := &fakeClock{ms: 1e9}
	const hosts = 8
	ix := newTestIndex(t, &MemStore{}, clk, Config{Shards: 1024, BucketMs: bucketMs, SegmentBlocks: o.segment, NoQueryHints: o.noHints})
	units := func(i int) int { return 1 << ix.level(i) }
	// 300 conversations: a shared system prompt (one of 5) then their own
	// turns; a request is a conversation's prefix up to a turn.
	systems := make([][]uint64, 5)
	for i := range systems {
		systems[i] = chain(seed*100+uint64(i), 8+rng.IntN(16))
	}
	convs := make([][]uint64, 300)
	total := 0
	for i := range convs {
		c := append([]uint64(nil), systems[rng.IntN(len(systems))]...)
		c = append(c, chain(seed*100000+uint64(i)+10, 10+rng.IntN(60))...)
		convs[i] = c
		for k := range c {
			total += units(k)
		}
	}
	capUnits := int(float64(total) * capFraction / hosts)
	refs := make([]HostRef, hosts)
	lru := make([]*lruHost, hosts)
	for h := range refs {
		refs[h], _ = ix.Register(fmt.Sprintf("h%d", h))
		if evict {
			ix.SetCapacity(refs[h], capUnits*ix.cfg.Hash.BlockChars/ix.cfg.Hash.CharsPerToken)
		}
		lru[h] = &lruHost{cap: capUnits, touch: map[uint64]lruItem{}}
	}
	zipf := rand.NewZipf(rng, 1.1, 4, uint64(len(convs)-1))
	var m Matches
	var d driftStats
	for req := 0; req < 6000; req++ {
		clk.ms += 20
		c := convs[zipf.Uint64()]
		c = c[:min(len(c), 8+rng.IntN(len(c)))]
		ix.Query(c, &m)
		best, bestN := rng.IntN(hosts), -1
		for h := range refs {
			if n := m.Blocks[refs[h].Slot]; n > bestN || (n == bestN && rng.IntN(2) == 0) {
				best, bestN = h, n
			}
		}
		if rng.IntN(5) == 0 { // load balancing sends some elsewhere
			best = rng.IntN(hosts)
		}
		stamp := m.Stamp(refs[best].Slot)
		cached := lru[best].match(c) // what the engine will report
		if err := ix.Record(refs[best], c, &m); err != nil {
			t.Fatal(err)
		}
		lru[best].record(c, clk.ms, units)
		if feedback {
			clk.ms++
			if _, err := ix.Correct(refs[best], stamp, cached); err != nil {
				t.Fatal(err)
			}
		}
		if req >= 1000 && req%10 == 0 {
			q := convs[rng.IntN(len(convs))]
			ix.Query(q, &m)
			for h := range refs {
				got, want := m.Blocks[refs[h].Slot], lru[h].match(q)
				d.pairs++
				d.refBlocks += want
				switch {
				case got == want:
					d.exact++
				case got > want:
					d.over++
					d.absBlocks += got - want
				default:
					d.under++
					d.absBlocks += want - got
				}
			}
		}
	}
	if testing.Verbose() {
		t.Logf("index metrics: %+v", ix.Metrics())
	}
	return d
}

// TestEvictionDriftAgainstExactLRU bounds how far the index's eviction
// drifts from the engines' LRU on a conversation workload (figures in
// docs/index.md, "Eviction and how far it drifts").
func TestEvictionDriftAgainstExactLRU(t *testing.T) {
	for _, tc := range []struct {
		capFraction float64
		minExact    float64
	}{{0.3, 0.85}, {0.6, 0.85}} {
		d := runDrift(t, 1, driftOpts{capFraction: tc.capFraction, bucketMs: 1000, evict: true})
		t.Logf("capacity %.0f%% of the working set, 1 s buckets: %v", 100*tc.capFraction, d)
		fd := runDrift(t, 1, driftOpts{capFraction: tc.capFraction, bucketMs: 1000, evict: true, feedback: true})
		t.Logf("  with cached_tokens feedback (Correct): %v", fd)
		if float64(d.exact) < tc.minExact*float64(d.pairs) {
			t.Errorf("capacity %.0f%%: only %v", 100*tc.capFraction, d)
		}
	}
}

// BenchmarkEvictionDrift reports the drift for several bucket widths and
// capacities (one workload replay per iteration).
func BenchmarkEvictionDrift(b *testing.B) {
	for _, capFraction := range []float64{0.3, 0.6} {
		for _, bucket := range []int64{0, 250, 1000, 4000, -1} {
			name := fmt.Sprintf("cap=%.0f%%/bucket=%dms", 100*capFraction, bucket)
			if bucket == 0 {
				name = fmt.Sprintf("cap=%.0f%%/no-eviction", 100*capFraction)
			}
			if bucket < 0 {
				name = fmt.Sprintf("cap=%.0f%%/bucket=1000ms+feedback", 100*capFraction)
			}
			b.Run(name, func(b *testing.B) {
				var d driftStats
				for i := 0; i < b.N; i++ {
					ms := bucket
					if ms <= 0 {
						ms = 1000
					}
					d = runDrift(b, 1, driftOpts{capFraction: capFraction, bucketMs: ms, evict: bucket != 0, feedback: bucket < 0})
				}
				b.ReportMetric(100*float64(d.exact)/float64(d.pairs), "exact%")
				b.ReportMetric(100*float64(d.over)/float64(d.pairs), "over%")
				b.ReportMetric(100*float64(d.under)/float64(d.pairs), "under%")
				b.ReportMetric(100*float64(d.absBlocks)/float64(max(d.refBlocks, 1)), "err%blocks")
			})
		}
	}
	// Segment length: continuations of a shared prefix share the shard of
	// the segment where they diverge; long segments overflow it.
	for _, seg := range []int{1, 4, 8, 16, 32} {
		b.Run(fmt.Sprintf("cap=30%%/segment=%d", seg), func(b *testing.B) {
			var d driftStats
			for i := 0; i < b.N; i++ {
				d = runDrift(b, 1, driftOpts{capFraction: 0.3, bucketMs: 1000, evict: true, segment: seg})
			}
			b.ReportMetric(100*float64(d.exact)/float64(d.pairs), "exact%")
			b.ReportMetric(100*float64(d.under)/float64(d.pairs), "under%")
			b.ReportMetric(100*float64(d.absBlocks)/float64(max(d.refBlocks, 1)), "err%blocks")
		})
	}
}
