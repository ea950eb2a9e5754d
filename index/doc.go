// Package index is kvroute's data layer: it hashes prompts into chained
// block hashes and keeps, in proxy-wasm shared data, which upstream host
// probably holds which block in its KV cache, plus per-host load counters.
//
// # Model
//
// Every Envoy worker runs its own Wasm VM; the only state they share is
// Envoy's shared-data map (one process-wide map per vm_id behind one
// mutex, values copied on every get, compare-and-set on write, no delete).
// The index is laid out for that map:
//
//   - a host slot table (one key, plus an 8-byte stamp of its latest
//     version): address hash to slot, a generation per
//     slot, a clear epoch per slot (removal and Clear make a host's bits
//     stop counting at once, without touching the shards), capacity and
//     eviction horizon;
//   - block shards (Config.Shards keys): a block picks its shard by
//     Fibonacci hashing of the first block of its segment (SegmentBlocks
//     consecutive blocks of a chain share a shard, so recording a chain
//     costs one write per segment); a shard is a small table of (tag, age,
//     host bitmap) entries sorted by tag, rewritten whole under CAS;
//   - a usage histogram per host (one key per slot): tracked blocks by
//     recency bucket, from which eviction moves the host's horizon as its
//     engine's LRU would;
//   - load counters (one key for all hosts);
//   - shared query hints (1024 keys, chosen by a chain's first block): the
//     chain lengths Records wrote recently, as (length, hash of the last
//     block) pairs.
//
// A Query copies the slot table's 8-byte stamp (the table itself only
// when it changed) and the few shards its binary search probes, guessing
// first at the chain's end and at the answers of the VM's last query of a
// chain with the same first block (on the VM's first query of that
// prefix, at the shared hints); Record rewrites one shard per segment
// of the blocks it adds, reusing the shards its Query copied.
// Values are self-describing (magic, version, exact length): anything
// short, corrupt or from another version reads as empty and is counted.
// Keys are never written with CAS 0 (Envoy would let two creators both
// win): see createCAS.
//
// The package imports no proxy-wasm SDK: it sees the proxy through Store,
// so the same code runs in unit tests, benchmarks, the fleet simulator
// (with MemStore) and unchanged inside the Wasm module (with the filter's
// adapter over GetSharedData/SetSharedData).
//
// An Index and a Hasher are per VM (per goroutine): not safe for
// concurrent use, and reused across requests so that steady-state
// requests allocate only what the Store's Get returns.
package index
