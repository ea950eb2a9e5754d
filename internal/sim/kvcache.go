package sim

// kvCache is the engine's paged KV memory with automatic prefix caching, the
// way vLLM v1's block pool works: a fixed pool of blocks; a block filled with
// prompt tokens is registered under its block hash so a later request with
// the same prefix reuses it; blocks nobody references stay cached in a free
// queue and are evicted least-recently-freed first when memory is needed.
type kvCache struct {
	blocks   []kvBlock
	byHash   map[uint64]int32 // block hash -> block index
	free     lruList          // unreferenced blocks, eviction order (front first)
	nFree    int
	used     int // blocks with ref > 0
	infinite bool
	// events, when non-nil, receives the cache's changes as vLLM's KV
	// events report them (see Engine.EnableKVEvents).
	events *[]KVEvent
}

type kvBlock struct {
	hash       uint64
	hashed     bool
	ref        int32
	prev, next int32 // free-list links; -1 when not in the list
	inFree     bool
}

type lruList struct{ head, tail int32 }

func newKVCache(numBlocks int, infinite bool) *kvCache {
	c := &kvCache{byHash: make(map[uint64]int32), free: lruList{-1, -1}, infinite: infinite}
	c.grow(numBlocks)
	return c
}

func (c *kvCache) grow(n int) {
	start := len(c.blocks)
	for i := 0; i < n; i++ {
		c.blocks = append(c.blocks, kvBlock{prev: -1, next: -1})
	}
	for i := start; i < len(c.blocks); i++ {
		c.pushBack(int32(i))
	}
}

func (c *kvCache) pushBack(i int32) {
	b := &c.blocks[i]
	b.prev, b.next, b.inFree = c.free.tail, -1, true
	if c.free.tail >= 0 {
		c.blocks[c.free.tail].next = i
	} else {
		c.free.head = i
	}
	c.free.tail = i
	c.nFree++
}

func (c *kvCache) pushFront(i int32) {
	b := &c.blocks[i]
	b.prev, b.next, b.inFree = -1, c.free.head, true
	if c.free.head >= 0 {
		c.blocks[c.free.head].prev = i
	} else {
		c.free.tail = i
	}
	c.free.head = i
	c.nFree++
}

func (c *kvCache) unlink(i int32) {
	b := &c.blocks[i]
	if b.prev >= 0 {
		c.blocks[b.prev].next = b.next
	} else {
		c.free.head = b.next
	}
	if b.next >= 0 {
		c.blocks[b.next].prev = b.prev
	} else {
		c.free.tail = b.prev
	}
	b.prev, b.next, b.inFree = -1, -1, false
	c.nFree--
}

// lookup returns how many leading hashes of the chain are cached.
func (c *kvCache) lookup(chain []uint64) int {
	for i, h := range chain {
		if _, ok := c.byHash[h]; !ok {
			return i
		}
	}
	return len(chain)
}

// acquire references the cached blocks of chain[:n], which lookup found.
func (c *kvCache) acquire(chain []uint64, n int, dst []int32) []int32 {
	for _, h := range chain[:n] {
		i := c.byHash[h]
		b := &c.blocks[i]
		if b.ref == 0 {
			c.unlink(i)
			c.used++
		}
		b.ref++
		dst = append(dst, i)
	}
	return dst
}

// available is the number of blocks that could be allocated now.
func (c *kvCache) available() int {
	if c.infinite {
		return 1 << 30
	}
	return c.nFree
}

// allocate takes n fresh blocks, evicting cached ones from the front of the
// free queue. The caller checked available().
func (c *kvCache) allocate(n int, dst []int32) []int32 {
	for ; n > 0; n-- {
		if c.infinite && (c.free.head < 0 || c.blocks[c.free.head].hashed) {
			// Unbounded memory never evicts: take a brand-new block.
			c.grow(1)
		}
		i := c.free.head
		if c.infinite && c.blocks[i].hashed {
			i = c.free.tail // the block grow just appended
		}
		c.unlink(i)
		b := &c.blocks[i]
		if b.hashed {
			if j, ok := c.byHash[b.hash]; ok && j == i {
				delete(c.byHash, b.hash)
				if c.events != nil {
					c.removed(b.hash)
				}
			}
			b.hashed = false
		}
		b.ref = 1
		c.used++
		dst = append(dst, i)
	}
	return dst
}

// register marks block i as holding the content identified by hash, so later
// requests can hit it. A hash already held by another block keeps that one.
// It reports whether the hash is newly cached.
func (c *kvCache) register(i int32, hash uint64) bool {
	if _, ok := c.byHash[hash]; ok {
		return false
	}
	b := &c.blocks[i]
	b.hash, b.hashed = hash, true
	c.byHash[hash] = i
	return true
}

// removed logs an evicted hash, merged into the previous event when that
// was an eviction too (vLLM reports a step's evictions together).
func (c *kvCache) removed(hash uint64) {
	ev := *c.events
	if n := len(ev); n > 0 && ev[n-1].Kind == KVRemoved {
		ev[n-1].Hashes = append(ev[n-1].Hashes, hash)
		return
	}
	*c.events = append(ev, KVEvent{Kind: KVRemoved, Hashes: []uint64{hash}})
}

// release drops one reference from each block. Freed blocks are queued in
// reverse so a prompt's tail is evicted before its head (the head is the
// part other requests share), as vLLM does.
func (c *kvCache) release(blocks []int32) {
	for k := len(blocks) - 1; k >= 0; k-- {
		i := blocks[k]
		b := &c.blocks[i]
		b.ref--
		if b.ref > 0 {
			continue
		}
		c.used--
		if b.hashed {
			c.pushBack(i)
		} else {
			c.pushFront(i) // nothing to reuse: evict first
		}
	}
}

// usage is the fraction of blocks referenced by running requests.
func (c *kvCache) usage() float64 {
	if len(c.blocks) == 0 {
		return 0
	}
	return float64(c.used) / float64(len(c.blocks))
}

// PrefixLRU is a bare prefix cache with the engine's block rules and no
// scheduling: requests are served one at a time and release their blocks at
// once. Replaying a workload through one PrefixLRU the size of a whole fleet
// gives the best hit ratio any router could reach on that fleet.
type PrefixLRU struct {
	c         *kvCache
	blockSize int
	scratch   []int32
}

// NewPrefixLRU makes a cache of numBlocks blocks of blockSize tokens;
// numBlocks <= 0 means unbounded.
func NewPrefixLRU(numBlocks, blockSize int) *PrefixLRU {
	return &PrefixLRU{c: newKVCache(max(numBlocks, 0), numBlocks <= 0), blockSize: blockSize}
}

// Serve looks the prompt up, returns its cached tokens (under the engine's
// rule that the last prompt token is always computed), then caches the
// prompt's full blocks as most recently used.
func (p *PrefixLRU) Serve(chain []uint64, promptTokens int) int {
	bs := p.blockSize
	hit := p.c.lookup(chain)
	if hit*bs >= promptTokens {
		hit = (promptTokens - 1) / bs
	}
	blocks := p.c.acquire(chain, hit, p.scratch[:0])
	need := (promptTokens+bs-1)/bs - hit
	if need > p.c.available() {
		need = p.c.available()
	}
	blocks = p.c.allocate(need, blocks)
	for i := hit; i < len(chain) && i < len(blocks); i++ {
		p.c.register(blocks[i], chain[i])
	}
	p.c.release(blocks)
	p.scratch = blocks[:0]
	return hit * bs
}
