package index

import (
	"math/rand/v2"
	"testing"
)

// lruReplay is one replay of runLRUReplay: matched units summed over the
// requests past the warm-up, and what each side held on average.
type lruReplay struct {
	index, ref   int // matched units summed over requests
	under, over  int // units the index under- and over-reported
	believed     int // mean units the index counted after each Record
	refHeld      int // mean units the reference held
	requests     int
	horizonMoves int
	// countDrift is the largest gap between the units the histogram
	// counts and those of the bits readers still count (sampled).
	countDrift int
}

// runLRUReplay replays, on one host, a workload of long prompts (the
// first 60-100% of one of 60 Zipf-popular documents, then a request's own
// tail; a prompt is up to a seventh of the host's capacity, as in long-context
// traces such as Mooncake's) through the index and through an exact LRU
// of the same capacity (lruHost: a request's blocks are used at its time,
// its tail evicted before its head, as vLLM frees them). Before each
// request is recorded, both predict how much of its prompt the host holds.
func runLRUReplay(t testing.TB, seed uint64, requests int) lruReplay {
	rng := rand.New(rand.NewPCG(seed, 7))
	clk := &fakeClock{ms: 1e9}
	ix := newTestIndex(t, &MemStore{}, clk, Config{Shards: 4096})
	units := func(i int) int { return 1 << ix.level(i) }
	chainUnits := func(n int) int {
		u := 0
		for i := 0; i < n; i++ {
			u += units(i)
		}
		return u
	}
	// Documents of 120-220 blocks (400-3,800 units); a request's own tail
	// is up to 60 more blocks of 4-64 units each.
	docs := make([][]uint64, 60)
	for i := range docs {
		docs[i] = chain(seed*1000+uint64(i)+1, 120+rng.IntN(100))
	}
	const capUnits = 40000
	zipf := rand.NewZipf(rng, 1.1, 2, uint64(len(docs)-1))
	ref, err := ix.Register("h0")
	if err != nil {
		t.Fatal(err)
	}
	if err := ix.SetCapacity(ref, capUnits*ix.cfg.Hash.BlockChars/ix.cfg.Hash.CharsPerToken); err != nil {
		t.Fatal(err)
	}
	lru := &lruHost{cap: capUnits, touch: map[uint64]lruItem{}}
	var r lruReplay
	var m Matches
	var horizon uint32
	for req := 0; req < requests; req++ {
		clk.ms += 300 + rng.Int64N(900)
		d := docs[zipf.Uint64()]
		c := append([]uint64(nil), d[:len(d)*(6+rng.IntN(5))/10]...)
		c = append(c, chain(seed<<32|uint64(req)+1, rng.IntN(60))...)
		if err := ix.Query(c, &m); err != nil {
			t.Fatal(err)
		}
		got, want := chainUnits(m.Blocks[ref.Slot]), chainUnits(lru.match(c))
		if req >= requests/5 { // past the warm-up: both caches are full
			r.requests++
			r.index += got
			r.ref += want
			if got < want {
				r.under += want - got
			} else {
				r.over += got - want
			}
		}
		if err := ix.Record(ref, c, &m); err != nil {
			t.Fatal(err)
		}
		lru.record(c, clk.ms, units)
		if req >= requests/5 {
			r.believed += int(ix.usageTotal(t, ref))
			r.refHeld += lru.used
		}
		if req%100 == 99 {
			r.countDrift = max(r.countDrift, abs(int(ix.usageTotal(t, ref))-ix.liveUnits(t, ref)))
		}
		if h := ix.table.recs[ref.Slot].horizon; h != horizon {
			horizon = h
			r.horizonMoves++
		}
	}
	r.believed /= max(r.requests, 1)
	r.refHeld /= max(r.requests, 1)
	return r
}

// usageTotal is the units ref's usage histogram counts.
func (ix *Index) usageTotal(t testing.TB, ref HostRef) uint32 {
	v, _, err := ix.store.Get(ix.usageKeys[ref.Slot])
	if err != nil || len(v) < usageHeader {
		t.Fatalf("usage histogram of slot %d: %v", ref.Slot, err)
	}
	return le.Uint32(v[16:])
}

// liveUnits sums the units of ref's bits that readers count: in entries
// refreshed at or after its horizon, over every shard.
func (ix *Index) liveUnits(t testing.TB, ref HostRef) int {
	ix.readSlots()
	hz := ix.table.recs[ref.Slot].horizon
	live := 0
	for _, k := range ix.shardKeys {
		v, _, err := ix.store.Get(k)
		if err != nil {
			continue
		}
		s, ok := parseShard(v)
		if !ok {
			t.Fatalf("shard %s does not parse", k)
		}
		for i := 0; i < s.n; i++ {
			if s.bitmap(i)[ref.Slot/64]&(1<<(ref.Slot%64)) == 0 || hz != 0 && int32(s.age(i)-hz) < 0 {
				continue
			}
			live += 1 << tagLevel(le.Uint32(s.buf[shardHeader+i*s.stride:]))
		}
	}
	return live
}

func abs(x int) int { return max(x, -x) }

// TestEvictionTracksExactLRU holds the index's eviction to the engine's:
// on long prompts, a recency bucket is a large share of a host's memory,
// and an index that drops the bucket straddling capacity whole (or evicts
// below capacity) holds less than the engine and forgets prefixes the
// engine still has. The index must count, on average, what the engine
// holds, and predict the matches an exact LRU of the same capacity gives.
func TestEvictionTracksExactLRU(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		r := runLRUReplay(t, seed, 3000)
		t.Logf("seed %d: index counts %d units on average, the LRU holds %d; matched units: index %d, LRU %d (under-reported %.1f%%, over-reported %.1f%%); %d horizon moves",
			seed, r.believed, r.refHeld, r.index, r.ref, 100*float64(r.under)/float64(r.ref), 100*float64(r.over)/float64(r.ref), r.horizonMoves)
		if d := float64(r.believed)/float64(r.refHeld) - 1; d < -0.02 || d > 0.02 {
			t.Errorf("seed %d: the index counts %d units on average where the engine's LRU holds %d (%+.1f%%): its horizon does not track the engine's eviction", seed, r.believed, r.refHeld, 100*d)
		}
		if 40*r.under > r.ref {
			t.Errorf("seed %d: the index under-reports %.1f%% of the units the LRU matches (at most 2.5%%): it forgets prefixes the engine still holds", seed, 100*float64(r.under)/float64(r.ref))
		}
		if r.countDrift != 0 {
			t.Errorf("seed %d: the usage histogram and the bits readers count differ by up to %d units: a refreshed block is counted twice or not at all", seed, r.countDrift)
		}
		if r.over > r.ref/20 {
			t.Errorf("seed %d: the index over-reports %.1f%% of the units the LRU matches (at most 5%%)", seed, 100*float64(r.over)/float64(r.ref))
		}
	}
}
