package index

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Config sets the index's shared-data layout and policies. Every VM and
// tool sharing one index (one Namespace) must use the same Shards,
// ShardEntries and Hash settings.
type Config struct {
	// Namespace prefixes every shared-data key, so several indexes (or
	// plugin versions) can share one vm_id. Default "kvroute/index".
	Namespace string
	// Shards is the number of block shards, a power of two. Default 4096.
	// Shards x ShardEntries bounds the distinct blocks tracked; size it to
	// the fleet's KV capacity in level-0 blocks (see SuggestShards).
	Shards int
	// ShardEntries caps the entries per shard. Default 64. A query copies
	// whole shards, so this bounds bytes copied per probe.
	ShardEntries int
	// SegmentBlocks groups consecutive blocks of a chain into one shard:
	// block i lives in the shard of block i - i%SegmentBlocks (a block's
	// hash already implies its whole prefix, so every chain that holds
	// block i agrees on that shard). Recording a new chain then rewrites
	// about N/SegmentBlocks shards instead of N, and a query's last probes
	// fall in shards it already copied. A power of two; default 8
	// (BenchmarkLayout for the write cost; longer segments skew the
	// index, see TestEvictionDriftAgainstExactLRU).
	SegmentBlocks int
	// CASRetries bounds the compare-and-set attempts per value before an
	// update is dropped (and counted). Default 16.
	CASRetries int
	// MaxQueryReads bounds the shard reads of one Query. Hosts whose search
	// is cut short get the longest prefix proven so far. Default 64.
	MaxQueryReads int
	// NoQueryHints stops Query from probing first where the VM's last
	// query of a chain with the same first block found its answers (see
	// Query). Hints cut a warm 128K-token query from 14 gets to 6, but
	// where presence has holes they stop the search at holes more often,
	// which under-reports matches (the drift replay measures how much:
	// docs/index.md).
	NoQueryHints bool
	// NoSharedHints keeps the hints per VM: Record does not publish the
	// lengths it writes in the shared hint line of the chain's first
	// block, and a VM's first query of a prefix does not read it (see
	// sharedhints.go). NoQueryHints implies it.
	NoSharedHints bool
	// TouchAfterMs: Record refreshes the recency of blocks a host already
	// holds only when their last refresh is older than this, so a hot
	// prefix costs shared-data writes at most once per interval.
	// Default 1000.
	TouchAfterMs int64
	// BucketMs is the width of the recency buckets of the per-host usage
	// histogram that drives eviction. Default 1000.
	BucketMs int64
	// Hash must equal the configuration of the Hasher producing the
	// chains: the index derives each block's weight from its position.
	Hash HashConfig
	// Now returns the time in milliseconds. Default: wall clock. The
	// simulator passes its virtual clock.
	Now func() int64
}

const (
	ageShift     = 4   // entry ages are in ticks of 16 ms: int32 spans a year
	usageBuckets = 256 // recency buckets per host
)

func (c Config) withDefaults() (Config, error) {
	if c.Namespace == "" {
		c.Namespace = "kvroute/index"
	}
	if c.Shards == 0 {
		c.Shards = 4096
	}
	if c.Shards < 1 || c.Shards > 1<<20 || c.Shards&(c.Shards-1) != 0 {
		return c, fmt.Errorf("index: Shards = %d: use a power of two between 1 and %d", c.Shards, 1<<20)
	}
	if c.ShardEntries == 0 {
		c.ShardEntries = 64
	}
	if c.SegmentBlocks == 0 {
		c.SegmentBlocks = 8
	}
	if c.SegmentBlocks < 1 || c.SegmentBlocks > 1024 || c.SegmentBlocks&(c.SegmentBlocks-1) != 0 {
		return c, fmt.Errorf("index: SegmentBlocks = %d: use a power of two between 1 and 1024", c.SegmentBlocks)
	}
	if c.ShardEntries < 1 || c.ShardEntries > 4096 {
		return c, fmt.Errorf("index: ShardEntries = %d: use 1..4096", c.ShardEntries)
	}
	if c.CASRetries <= 0 {
		c.CASRetries = 16
	}
	if c.MaxQueryReads <= 0 {
		c.MaxQueryReads = 64
	}
	if c.TouchAfterMs <= 0 {
		c.TouchAfterMs = 1000
	}
	if c.BucketMs <= 0 {
		c.BucketMs = 1000
	}
	c.Hash = c.Hash.withDefaults()
	if c.Now == nil {
		c.Now = func() int64 { return time.Now().UnixMilli() }
	}
	return c, nil
}

// SuggestShards returns the power-of-two shard count that lets
// shardEntries-entry shards hold blocks distinct level-0 blocks at most
// half full: blocks arrive in segments of Config.SegmentBlocks, so shard
// fill varies more than block by block, and a full shard evicts its
// oldest entry whatever the hosts' capacities (counted in Overflows).
func SuggestShards(blocks, shardEntries int) int {
	if shardEntries <= 0 {
		shardEntries = 64
	}
	need := blocks*2/shardEntries + 1
	s := 1
	for s < need && s < 1<<20 {
		s <<= 1
	}
	return s
}

// HostRef names one incarnation of a host slot. Slot indexes per-host
// slices (Matches.Blocks, scorer arrays); Gen changes when the slot is
// given to another address, so a stale reference cannot write into the
// new host's state.
type HostRef struct {
	Slot int
	Gen  uint32
}

// Errors returned by Index methods.
var (
	// ErrStaleHost: the host was removed (or its slot reassigned) since the
	// HostRef was obtained. Look the address up again.
	ErrStaleHost = errors.New("index: host reference is stale (host removed or slot reassigned); look the address up again")
	// ErrTableFull: all MaxSlots slots hold hosts. Remove departed hosts.
	ErrTableFull = errors.New("index: host slot table is full; remove departed hosts first")
	// ErrContended: an update still met concurrent writers after
	// Config.CASRetries attempts and was dropped (counted in CASFailures).
	ErrContended = errors.New("index: shared data update dropped after repeated CAS conflicts")
)

// Metrics are plain counters, per Index (per VM), for the filter to export.
type Metrics struct {
	Queries, Records uint64
	// Reads and BytesRead count shared-data gets and the bytes they copied.
	Reads, BytesRead uint64
	// Writes and BytesWritten count successful shared-data sets.
	Writes, BytesWritten uint64
	// CASRetries counts sets rejected by a concurrent writer and retried;
	// CASFailures counts updates dropped after Config.CASRetries attempts.
	CASRetries, CASFailures uint64
	// Corrupt counts values that were short, corrupt or of another format
	// version; they were treated as empty.
	Corrupt uint64
	// Evictions counts level-0 block units dropped because a host exceeded
	// its capacity; Overflows counts entries dropped because a shard was
	// full (the index is smaller than the fleet's KV capacity).
	Evictions, Overflows uint64
	// StoreErrors counts store failures other than not-found and CAS
	// mismatch.
	StoreErrors uint64
	// Truncated counts queries cut short by Config.MaxQueryReads.
	Truncated uint64
	// Corrections counts horizons moved by Correct (the engine held fewer
	// blocks than predicted).
	Corrections uint64
}

// Index is one VM's handle on the shared block index. The state lives in
// the Store; an Index holds only scratch buffers and the last slot table
// it read, so it is cheap, but it is not safe for concurrent use: give
// each VM (each goroutine in tests) its own Index on the same Store.
type Index struct {
	cfg       Config
	store     Store
	appender  AppendGetter // store's AppendGetter, or a getAppender over its Get
	shardBits uint
	shardKeys []string
	slotsKey  string
	stampKey  string
	loadKey   string
	usageKeys [MaxSlots]string

	table      slotTable
	tableFresh bool   // ix.table was read by the Query whose Matches Record got
	tableCAS   uint32 // CAS of the stored value ix.table was decoded from
	tableOK    bool   // ix.table is a table stored at tableAt (its seq is meaningful)
	tableAt    int64  // ms clock of the last full read of the table
	metrics    Metrics

	// query state
	q     queryState
	hints [hintLines]hintLine
	// shared hints: this VM's copy of the last shared hint line it read
	shared   sharedState
	hintKeys []string
	// read scratch: values read into these are consumed before the next
	// read into the same buffer (see getInto)
	stampBuf []byte // small values parsed at once: the slot stamp, a hint line
	tableBuf []byte // the slot table
	shardBuf []byte // updateShard's own reads, edited in place
	usageBuf []byte // bookUsage's histogram, edited in place
	// the load counters as Loads last read them (loadBuf also receives
	// updateLoad's reads); loadFresh: no update since, so an AddLoad may
	// start from loadBuf and loadCAS instead of reading the key again
	loadBuf   []byte
	loadCAS   uint32
	loadFound bool
	loadFresh bool
	// pinned, when pinnedOK, is the clock every read of Config.Now
	// returns instead (PinClock)
	pinned   int64
	pinnedOK bool
	// record scratch
	work    []byte
	enc     []byte
	deltas  []usageDelta
	pending []usageDelta
	ins     []uint32   // tags a shard update adds
	seg     []segBlock // the blocks of a shard update
	// Sync scratch (sync.go)
	syncWant  map[uint64]int32 // address hash -> first host index
	syncSlots map[uint64]int32 // address hash -> slot, of the table being edited
	syncHash  []uint64
	syncReuse []int32
	syncNew   []int32
	syncLoads []Load
}

type entry struct {
	tag  uint32
	age  uint32
	bits [maxWords]uint64
}

type usageDelta struct {
	bucket uint32
	units  int32
}

// New returns an Index over store. It reads nothing yet.
func New(store Store, cfg Config) (*Index, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ix := &Index{
		cfg:       cfg,
		store:     store,
		shardBits: uint(bits.TrailingZeros(uint(cfg.Shards))),
		slotsKey:  cfg.Namespace + "/slots",
		stampKey:  cfg.Namespace + "/slots/v",
		loadKey:   cfg.Namespace + "/load",
	}
	ix.appender, _ = store.(AppendGetter)
	if ix.appender == nil {
		ix.appender = &getAppender{store}
	}
	ix.shardKeys = make([]string, cfg.Shards)
	for i := range ix.shardKeys {
		ix.shardKeys[i] = cfg.Namespace + "/b/" + strconv.FormatUint(uint64(i), 36)
	}
	for i := range ix.usageKeys {
		ix.usageKeys[i] = cfg.Namespace + "/u/" + strconv.Itoa(i)
	}
	return ix, nil
}

// Config returns the effective configuration.
func (ix *Index) Config() Config { return ix.cfg }

// Metrics returns the counters so far.
func (ix *Index) Metrics() Metrics { return ix.metrics }

// CASRetries returns Metrics().CASRetries without copying the others.
func (ix *Index) CASRetries() uint64 { return ix.metrics.CASRetries }

func (ix *Index) nowAge() uint32 { return uint32(ix.now() >> ageShift) }

// now is Config.Now, or the pinned clock.
func (ix *Index) now() int64 {
	if ix.pinnedOK {
		return ix.pinned
	}
	return ix.cfg.Now()
}

// PinClock makes the index take ms as the time (in Config.Now's
// milliseconds) until UnpinClock, instead of calling Config.Now: one
// routing decision reads the clock once and passes it down, where the
// index would read it three or four times (in Wasm every read of the
// wall clock is two host calls).
func (ix *Index) PinClock(ms int64) { ix.pinned, ix.pinnedOK = ms, true }

// UnpinClock makes the index call Config.Now again.
func (ix *Index) UnpinClock() { ix.pinnedOK = false }

// shardAt returns the shard of chain position i: its segment's first block
// picks it.
func (ix *Index) shardAt(chain []uint64, i int) int {
	return shardOf(chain[i&^(ix.cfg.SegmentBlocks-1)], ix.shardBits)
}

// level returns the resolution level of chain position i.
func (ix *Index) level(i int) int {
	h := ix.cfg.Hash
	if h.LevelBlocks < 0 {
		return 0
	}
	l := i / h.LevelBlocks
	if l > h.MaxLevel {
		l = h.MaxLevel
	}
	if l > 15 {
		l = 15
	}
	return l
}

// getInto reads key into (*buf)[:0] (a Store without AppendGetter
// returns a fresh slice instead: see getAppender), keeps the result in
// *buf as the buffer for the next read (it grows as needed), and books the
// read in the metrics. It returns the value, its CAS and whether the key
// was found: false for a missing key or a store error (counted), the value
// then empty. The caller must be done with the value before reading into
// the same buffer again.
//
// Reading, booking and keeping the buffer are one function because every
// read of a routed request comes through here: in Wasm each function
// entered, and each call site's copying of arguments and results, costs
// code.
func (ix *Index) getInto(buf *[]byte, key string) ([]byte, uint32, bool) {
	v, cas, err := ix.appender.GetAppend((*buf)[:0], key)
	ix.metrics.Reads++
	found := err == nil
	if found {
		ix.metrics.BytesRead += uint64(len(v))
	} else {
		ix.readFailed(err)
		v, cas = (*buf)[:0], 0 // keep the buffer for the next read
	}
	*buf = v
	return v, cas, found
}

// readFailed books a failed read as a store error unless the key is missing
// (ErrNotFound, bare as the stores return it, or wrapped). It is out of
// getInto (hence noinline) because most reads of a routed request find their
// key: each function entered costs a request (docs/performance.md).
//
//go:noinline
func (ix *Index) readFailed(err error) {
	if err != ErrNotFound && !errors.Is(err, ErrNotFound) {
		ix.metrics.StoreErrors++
	}
}

// createCAS is the CAS the index writes a key it found missing with.
//
// Envoy sets a missing key whatever the CAS, and CAS 0 sets any key
// unconditionally: two workers that both found a key missing and both
// wrote with CAS 0 would lose the first write. Writing with a nonzero CAS
// instead creates the key if it is still missing and fails with a CAS
// mismatch if a racer created it first (then we re-read and merge). The
// only false success is a key whose current CAS is exactly this value,
// one set in 2^32 of the global counter.
const createCAS = ^uint32(0)

// set writes key with cas (from get; 0 when the key was missing). It
// returns retry=true on a CAS mismatch.
func (ix *Index) set(key string, v []byte, cas uint32) (retry bool, err error) {
	if cas == 0 {
		cas = createCAS
	}
	// One return: in Wasm each return site costs code.
	if err = ix.store.Set(key, v, cas); err == nil {
		ix.metrics.Writes++
		ix.metrics.BytesWritten += uint64(len(v))
	} else {
		retry = ix.setFailed(err)
	}
	return retry, err
}

// setFailed books a failed set and reports whether to retry it (a CAS
// mismatch). It is out of set (hence noinline) for the reason of
// readFailed: writes rarely fail.
//
//go:noinline
func (ix *Index) setFailed(err error) (retry bool) {
	if err == ErrCASMismatch || errors.Is(err, ErrCASMismatch) {
		ix.metrics.CASRetries++
		return true
	}
	ix.metrics.StoreErrors++
	return false
}

// slotsRecheckMs bounds how long a VM trusts the stamp alone: after it,
// the next cheap read copies the whole table again (and repairs a stamp
// left behind by a writer that died between the table and the stamp).
const slotsRecheckMs = 1000

// refreshSlots brings ix.table up to date for readers (Query, Record,
// Lookup), copying only the 8-byte stamp when the table is unchanged: at
// 256 hosts the table is 6 KB, a query's shards a few KB.
//
// A reader may act on a table a few microseconds old (a writer sets the
// table, then the stamp): that is the same as having read the table a
// little earlier, which is safe, since shards carry the table epoch they
// were written under (see staleMask). Writers that need the authority
// (updateSlots, a shard written under a newer epoch) read the table.
func (ix *Index) refreshSlots() {
	now := ix.now()
	if ix.tableOK && now >= ix.tableAt && now-ix.tableAt < slotsRecheckMs {
		v, _, found := ix.getInto(&ix.stampBuf, ix.stampKey)
		if found {
			if seq, ok := parseStamp(v); ok && seq == ix.table.seq {
				return
			}
		}
	}
	ix.reloadSlots()
}

// reloadSlots is refreshSlots' slow path: the stamp moved or the recheck is
// due. Most requests only read the stamp; keeping this out of line keeps the
// code they enter small (each function entered costs a request:
// docs/performance.md).
func (ix *Index) reloadSlots() {
	ix.readSlots()
	if !ix.tableOK {
		return
	}
	// Repair a stamp that fell behind the table (its writer died between
	// the two sets), so that other VMs see the table before their recheck.
	v, _, found := ix.getInto(&ix.stampBuf, ix.stampKey)
	if seq, ok := parseStamp(v); !found || !ok || int32(seq-ix.table.seq) < 0 {
		ix.writeStamp(ix.table.seq)
	}
}

// readSlots refreshes ix.table from the store, copying the whole table.
// The decoded table is kept while the stored CAS is unchanged: CAS values
// come from one global counter, so an unchanged CAS is an unchanged value,
// and most reads skip decoding (a few microseconds in Wasm at 64 hosts).
func (ix *Index) readSlots() (cas uint32) {
	ix.tableAt = ix.now()
	v, cas, found := ix.getInto(&ix.tableBuf, ix.slotsKey)
	if !found {
		ix.table.reset()
		ix.tableCAS, ix.tableOK = 0, false
		return 0
	}
	if cas != 0 && cas == ix.tableCAS {
		return cas
	}
	ix.tableCAS, ix.tableOK = 0, false
	if !decodeSlots(v, &ix.table) {
		ix.metrics.Corrupt++
		return cas
	}
	ix.tableCAS, ix.tableOK = cas, true
	return cas
}

// stampSeq returns the seq in the stamp (0 when missing or bad).
func (ix *Index) stampSeq() uint32 {
	v, _, found := ix.getInto(&ix.stampBuf, ix.stampKey)
	if !found {
		return 0
	}
	seq, _ := parseStamp(v)
	return seq
}

// writeStamp publishes seq unless the stamp already holds it or a later
// one (two writers may finish their stamps out of order).
func (ix *Index) writeStamp(seq uint32) {
	for attempt := 0; attempt < ix.cfg.CASRetries; attempt++ {
		v, cas, found := ix.getInto(&ix.stampBuf, ix.stampKey)
		if found {
			if cur, ok := parseStamp(v); ok && int32(cur-seq) >= 0 {
				return
			}
		}
		var buf [stampLen]byte
		retry, err := ix.set(ix.stampKey, encodeStamp(buf[:0], seq), cas)
		if !retry {
			_ = err // counted; readers fall back to the table within slotsRecheckMs
			return
		}
	}
	ix.metrics.CASFailures++
}

// updateSlots applies fn to a fresh slot table under CAS, then publishes
// its seq in the stamp.
func (ix *Index) updateSlots(fn func(t *slotTable) (write bool, err error)) error {
	for attempt := 0; attempt < ix.cfg.CASRetries; attempt++ {
		cas := ix.readSlots()
		ix.tableCAS = 0 // fn may change ix.table: decode afresh next time
		write, err := fn(&ix.table)
		if err != nil || !write {
			return err
		}
		// The new seq must differ from every seq a reader may hold: above
		// the stamp too, in case the table was replaced (corrupt, reset).
		seq := ix.table.seq
		if !ix.tableOK { // missing or replaced: continue from the stamp
			if s := ix.stampSeq(); int32(s-seq) > 0 {
				seq = s
			}
		}
		ix.table.seq = seq + 1
		ix.enc = encodeSlots(ix.enc, &ix.table)
		retry, err := ix.set(ix.slotsKey, ix.enc, cas)
		if retry {
			continue
		}
		if err != nil {
			ix.tableOK = false
			return fmt.Errorf("index: writing the host slot table: %w", err)
		}
		// Re-read so ix.table matches what is stored (decodeSlots derives
		// the active mask and other summaries).
		decodeSlots(ix.enc, &ix.table)
		ix.tableOK = true
		ix.writeStamp(ix.table.seq)
		return nil
	}
	ix.tableOK = false
	ix.metrics.CASFailures++
	return ErrContended
}

func addrHash(addr string) uint64 {
	h := xxhash.Sum64String(addr)
	if h == 0 {
		h = 1
	}
	return h
}

// Register returns addr's slot, assigning a free one if addr is new. A
// reassigned slot gets a new generation and starts empty: the previous
// host's blocks, usage and load do not carry over.
func (ix *Index) Register(addr string) (HostRef, error) {
	ah := addrHash(addr)
	var ref HostRef
	err := ix.updateSlots(func(t *slotTable) (bool, error) {
		free := -1
		for i := 0; i < t.n; i++ {
			if t.recs[i].addrHash == ah {
				ref = HostRef{Slot: i, Gen: t.recs[i].gen}
				return false, nil
			}
			if free < 0 && t.recs[i].addrHash == 0 {
				free = i
			}
		}
		if free < 0 {
			if t.n >= MaxSlots {
				return false, ErrTableFull
			}
			free = t.n
			t.n++
			t.recs[free] = slotRec{}
		}
		r := &t.recs[free]
		if r.gen != 0 {
			// A used slot: its old bits must stop counting.
			t.epoch++
			r.clearEpoch = t.epoch
		}
		r.gen++
		r.addrHash = ah
		r.capacity = 0
		r.horizon = 0
		ref = HostRef{Slot: free, Gen: r.gen}
		return true, nil
	})
	return ref, err
}

// Lookup returns addr's slot as of the slot table in the store.
func (ix *Index) Lookup(addr string) (HostRef, bool) {
	ix.refreshSlots()
	ah := addrHash(addr)
	if ref, ok := ix.lookupCached(ah); ok {
		return ref, true
	}
	// Not in the table the stamp vouches for: read the table itself, in
	// case the stamp is behind (a writer between its two sets).
	ix.readSlots()
	return ix.lookupCached(ah)
}

func (ix *Index) lookupCached(ah uint64) (HostRef, bool) {
	t := &ix.table
	for i := 0; i < t.n; i++ {
		if t.recs[i].addrHash == ah {
			return HostRef{Slot: i, Gen: t.recs[i].gen}, true
		}
	}
	return HostRef{}, false
}

// Slots returns the number of slots in use or used before (the length
// per-slot slices need), as of the last read of the slot table.
func (ix *Index) Slots() int { return ix.table.n }

// Remove frees addr's slot. Its blocks stop counting at once for every
// reader of the slot table; their bits are dropped lazily as shards are
// rewritten. Removing an unknown address is not an error.
func (ix *Index) Remove(addr string) error {
	ah := addrHash(addr)
	return ix.updateSlots(func(t *slotTable) (bool, error) {
		for i := 0; i < t.n; i++ {
			if t.recs[i].addrHash == ah {
				t.epoch++
				t.recs[i].addrHash = 0
				t.recs[i].clearEpoch = t.epoch
				t.recs[i].horizon = 0
				return true, nil
			}
		}
		return false, nil
	})
}

// Clear forgets every block of the host (the engine reported
// AllBlocksCleared, or restarted). The host keeps its slot.
func (ix *Index) Clear(ref HostRef) error {
	return ix.updateSlots(func(t *slotTable) (bool, error) {
		if err := t.check(ref); err != nil {
			return false, err
		}
		t.epoch++
		t.recs[ref.Slot].clearEpoch = t.epoch
		t.recs[ref.Slot].horizon = 0
		return true, nil
	})
}

// SetCapacity sets how many prompt tokens the host's KV cache holds
// (num_gpu_blocks x block_size from vllm:cache_config_info), 0 for
// unbounded. When recorded blocks exceed it, the host's least recently
// used blocks stop counting.
func (ix *Index) SetCapacity(ref HostRef, tokens int) error {
	units := ix.tokensToUnits(tokens)
	return ix.updateSlots(func(t *slotTable) (bool, error) {
		if err := t.check(ref); err != nil {
			return false, err
		}
		if t.recs[ref.Slot].capacity == units {
			return false, nil
		}
		t.recs[ref.Slot].capacity = units
		return true, nil
	})
}

// tokensToUnits converts tokens to level-0 blocks, rounding up.
func (ix *Index) tokensToUnits(tokens int) uint32 {
	if tokens <= 0 {
		return 0
	}
	h := ix.cfg.Hash
	u := (int64(tokens)*int64(h.CharsPerToken) + int64(h.BlockChars) - 1) / int64(h.BlockChars)
	if u > 1<<31 {
		u = 1 << 31
	}
	return uint32(u)
}

func (t *slotTable) check(ref HostRef) error {
	if ref.Slot < 0 || ref.Slot >= t.n || t.recs[ref.Slot].addrHash == 0 || t.recs[ref.Slot].gen != ref.Gen {
		return ErrStaleHost
	}
	return nil
}
