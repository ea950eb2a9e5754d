package index

import (
	"fmt"
	"strconv"
	"testing"
	"time"
)

// Benchmarks compare the index with a naive baseline measured in the
// same run: one shared-data key per (host, block) and, per query, a scan
// of every host's blocks from the start until its first miss (P x N gets
// at worst). Run them natively with
//
//	go test -run '^$' -bench . ./index/
//
// and inside Wasm (wazero) with
//
//	GOOS=wasip1 GOARCH=wasm go test -exec "go run ./index/internal/wasmexec" -run '^$' -bench . ./index/

var (
	benchTokens = []int{1 << 10, 8 << 10, 32 << 10, 128 << 10}
	benchHosts  = []int{8, 64, 256}
)

// benchChain hashes a synthetic prompt of about tokens tokens.
func benchChain(h *Hasher, seed, tokens int) []uint64 {
	h.Reset("bench-model", "", "")
	h.Text(longText(seed, tokens*h.cfg.CharsPerToken))
	out := make([]uint64, len(h.Blocks()))
	copy(out, h.Blocks())
	return out
}

// benchFleet is an index populated like a busy fleet: every host holds
// the system prefix of the queried chain and many unrelated chains (the
// shards about half full); three hosts hold the chain to 100%, 60% and
// 30%. A query therefore meets K = 4 distinct match lengths.
type benchFleet struct {
	st    Store
	ix    *Index
	refs  []HostRef
	chain []uint64
	naive *naiveIndex
	clk   *fakeClock
	// runs counts the "new prompt" benchmark runs on this fleet: testing
	// runs a sub-benchmark several times on the same fleet (N=1 first,
	// then once per -test.count), and each run must record chains no
	// earlier run recorded, or it re-records chains whose entries are
	// still in their shards (no insert, no room to make) and measures
	// less than a new prompt.
	runs uint64
}

// freshSeed returns the seed of new chain i of the fleet's current run
// (see runs): tokens in bits 0-19, the run in bits 20-30, salt (bit 31)
// apart, i from bit 32.
func (f *benchFleet) freshSeed(i int, salt uint64, tokens int) uint64 {
	return uint64(i)<<32 | salt | (f.runs%2048)<<20 | uint64(tokens)
}

func newBenchFleet(b *testing.B, hosts, tokens int, cfg Config, withNaive bool) *benchFleet {
	b.Helper()
	resetBenchStore()
	f := &benchFleet{st: benchStore(), clk: &fakeClock{ms: 1e9}}
	cfg.Now = f.clk.now
	ix, err := New(f.st, cfg)
	if err != nil {
		b.Fatal(err)
	}
	f.ix = ix
	h := NewHasher(ix.cfg.Hash)
	f.chain = benchChain(h, 1, tokens)
	n := len(f.chain)
	if withNaive {
		f.naive = &naiveIndex{st: benchStore()}
	}
	// Each host's capacity is its share of 60% of the index, so the
	// index evicts by host capacity (as configured from the engines'
	// num_gpu_blocks) rather than by overflowing shards.
	capEntries := ix.cfg.Shards * ix.cfg.ShardEntries
	hostTokens := capEntries * 6 / 10 / hosts * ix.cfg.Hash.BlockChars / ix.cfg.Hash.CharsPerToken
	for p := 0; p < hosts; p++ {
		ref, err := ix.Register(fmt.Sprintf("10.1.%d.%d:8000", p/250, p%250))
		if err != nil {
			b.Fatal(err)
		}
		if err := ix.SetCapacity(ref, hostTokens); err != nil {
			b.Fatal(err)
		}
		f.refs = append(f.refs, ref)
	}
	// Background: fill 40% of the index's entries (a fuller index
	// starts overflowing its fullest shards; see BenchmarkMemoryPerBlock).
	perHost := capEntries * 4 / 10 / hosts / 64
	for p, ref := range f.refs {
		for k := 0; k < perHost; k++ {
			bg := chain(uint64(p*100000+k+7), 64)
			ix.Record(ref, bg, nil)
		}
	}
	sys := n / 10
	if sys < 1 {
		sys = 1
	}
	for p, ref := range f.refs {
		held := sys
		switch p {
		case 0:
			held = n
		case 1:
			held = n * 6 / 10
		case 2:
			held = n * 3 / 10
		}
		ix.Record(ref, f.chain[:held], nil)
		if f.naive != nil {
			f.naive.record(p, f.chain[:held])
		}
	}
	return f
}

// reportCPU adds cpu-ns/op (see cpuNow) when the platform measures it.
func reportCPU(b *testing.B, start time.Duration) {
	if start == 0 {
		return
	}
	b.ReportMetric(float64(cpuNow()-start)/float64(b.N), "cpu-ns/op")
}

func benchName(hosts, tokens int) string {
	return fmt.Sprintf("tokens=%dK/hosts=%d", tokens>>10, hosts)
}

// BenchmarkQuery: the index's Query against the naive scan, same state.
func BenchmarkQuery(b *testing.B) {
	for _, tokens := range benchTokens {
		for _, hosts := range benchHosts {
			f := newBenchFleet(b, hosts, tokens, Config{}, true)
			b.Run(benchName(hosts, tokens)+"/index", func(b *testing.B) {
				var m Matches
				r0, by0 := f.ix.metrics.Reads, f.ix.metrics.BytesRead
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := cpuNow()
				for i := 0; i < b.N; i++ {
					f.ix.Query(f.chain, &m)
				}
				b.StopTimer()
				reportCPU(b, cpu0)
				if m.Blocks[0] != len(f.chain) || m.Blocks[3] != len(f.chain)/10 {
					b.Fatalf("wrong answer: host0 %d host3 %d of %d", m.Blocks[0], m.Blocks[3], len(f.chain))
				}
				b.ReportMetric(float64(f.ix.metrics.Reads-r0)/float64(b.N), "gets/op")
				b.ReportMetric(float64(f.ix.metrics.BytesRead-by0)/float64(b.N), "copiedB/op")
				b.ReportMetric(float64(len(f.chain)), "blocks")
			})
			// Cold: no hints from an earlier query of this chain (a VM
			// that never saw its first block): the shared hint line the
			// fleet's Records published, and the probe of the chain's
			// end. "index-unshared": without the shared line either (a
			// chain whose line another chain's Record replaced, or
			// Config.NoSharedHints).
			for _, unshared := range []bool{false, true} {
				name := "/index-cold"
				if unshared {
					name = "/index-unshared"
				}
				b.Run(benchName(hosts, tokens)+name, func(b *testing.B) {
					f.ix.cfg.NoSharedHints = unshared
					defer func() { f.ix.cfg.NoSharedHints = false }()
					var m Matches
					r0, by0 := f.ix.metrics.Reads, f.ix.metrics.BytesRead
					b.ReportAllocs()
					b.ResetTimer()
					cpu0 := cpuNow()
					for i := 0; i < b.N; i++ {
						f.ix.hints = [hintLines]hintLine{}
						f.ix.Query(f.chain, &m)
					}
					b.StopTimer()
					reportCPU(b, cpu0)
					if m.Blocks[0] != len(f.chain) || m.Blocks[3] != len(f.chain)/10 {
						b.Fatalf("wrong answer: host0 %d host3 %d of %d", m.Blocks[0], m.Blocks[3], len(f.chain))
					}
					b.ReportMetric(float64(f.ix.metrics.Reads-r0)/float64(b.N), "gets/op")
					b.ReportMetric(float64(f.ix.metrics.BytesRead-by0)/float64(b.N), "copiedB/op")
				})
			}
			b.Run(benchName(hosts, tokens)+"/naive", func(b *testing.B) {
				out := make([]int, hosts)
				b.ReportAllocs()
				b.ResetTimer()
				var gets, bytes int
				cpu0 := cpuNow()
				for i := 0; i < b.N; i++ {
					gets, bytes = f.naive.query(hosts, f.chain, out)
				}
				b.StopTimer()
				reportCPU(b, cpu0)
				if out[0] != len(f.chain) {
					b.Fatalf("naive: host0 %d of %d", out[0], len(f.chain))
				}
				b.ReportMetric(float64(gets), "gets/op")
				b.ReportMetric(float64(bytes), "copiedB/op")
			})
		}
	}
}

// BenchmarkQueryRecord: one routing decision's index work, Query then
// Record, for a repeated prompt (the host holds it, fresh: no writes) and
// for a new one (every block written), against the naive design doing
// the same (scan, then one set per new block).
func BenchmarkQueryRecord(b *testing.B) {
	for _, tokens := range benchTokens {
		for _, hosts := range benchHosts {
			f := newBenchFleet(b, hosts, tokens, Config{}, true)
			b.Run(benchName(hosts, tokens)+"/index-repeat", func(b *testing.B) {
				var m Matches
				b.ReportAllocs()
				cpu0 := cpuNow()
				for i := 0; i < b.N; i++ {
					f.ix.Query(f.chain, &m)
					f.ix.Record(f.refs[0], f.chain, &m)
				}
				reportCPU(b, cpu0)
			})
			// New prompts: a fresh chain of the same length every time
			// (generating it costs about 1 ns per block).
			n := len(f.chain)
			c := make([]uint64, n)
			// "index-new-unshared": the same without publishing the
			// chain's length in the shared hint line (Config.NoSharedHints),
			// on other fresh chains: what the publishing costs.
			for _, unshared := range []bool{false, true} {
				name, salt := "/index-new", uint64(0)
				if unshared {
					name, salt = "/index-new-unshared", 1<<31
				}
				b.Run(benchName(hosts, tokens)+name, func(b *testing.B) {
					f.ix.cfg.NoSharedHints = unshared
					defer func() { f.ix.cfg.NoSharedHints = false }()
					var m Matches
					w0, o0 := f.ix.metrics.Writes, f.ix.metrics.Overflows
					f.runs++
					b.ReportAllocs()
					cpu0 := cpuNow()
					for i := 0; i < b.N; i++ {
						f.clk.ms += 5 // 200 new prompts per second
						fillChain(c, f.freshSeed(i, salt, tokens))
						f.ix.Query(c, &m)
						f.ix.Record(f.refs[i%hosts], c, &m)
					}
					b.StopTimer()
					reportCPU(b, cpu0)
					b.ReportMetric(float64(f.ix.metrics.Writes-w0)/float64(b.N), "sets/op")
					b.ReportMetric(float64(f.ix.metrics.Overflows-o0)/float64(b.N), "overflows/op")
				})
			}
			b.Run(benchName(hosts, tokens)+"/naive-new", func(b *testing.B) {
				out := make([]int, hosts)
				f.runs++
				b.ReportAllocs()
				cpu0 := cpuNow()
				for i := 0; i < b.N; i++ {
					fillChain(c, f.freshSeed(i, 1<<31, tokens))
					f.naive.query(hosts, c, out)
					f.naive.record(i%hosts, c)
				}
				reportCPU(b, cpu0)
			})
		}
	}
}

// BenchmarkHash: hashing a prompt (excluded from the query targets).
func BenchmarkHash(b *testing.B) {
	h := NewHasher(HashConfig{})
	for _, tokens := range benchTokens {
		text := longText(3, tokens*4)
		b.Run(fmt.Sprintf("tokens=%dK", tokens>>10), func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				h.Reset("m", "", "")
				h.Message("user", text)
				_ = h.Blocks()
			}
		})
	}
}

// BenchmarkMemoryPerBlock reports shared-data bytes per tracked block
// (keys included) for fleets of 8, 64 and 256 hosts, each block held by
// one host, the index 70% full.
func BenchmarkMemoryPerBlock(b *testing.B) {
	for _, hosts := range benchHosts {
		b.Run(fmt.Sprintf("hosts=%d", hosts), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				st := &MemStore{}
				clk := &fakeClock{ms: 1e9}
				ix, _ := New(st, Config{Shards: 1024, Now: clk.now})
				blocks := 0
				target := 1024 * 32 * 7 / 10
				for p := 0; p < hosts; p++ {
					ref, _ := ix.Register("h" + strconv.Itoa(p))
					for ; blocks < target*(p+1)/hosts; blocks += 64 {
						ix.Record(ref, chain(uint64(blocks+1), 64), nil)
					}
				}
				_, bytes := st.Len()
				b.ReportMetric(float64(bytes)/float64(blocks), "B/block")
				b.ReportMetric(float64(ix.metrics.Overflows), "overflows")
			}
		})
	}
}

// naiveIndex is the baseline: one key per (host, block).
type naiveIndex struct {
	st  Store
	buf []byte
}

func (n *naiveIndex) key(host int, h uint64) string {
	n.buf = append(n.buf[:0], "naive/"...)
	n.buf = strconv.AppendInt(n.buf, int64(host), 10)
	n.buf = append(n.buf, '/')
	n.buf = strconv.AppendUint(n.buf, h, 16)
	return string(n.buf)
}

func (n *naiveIndex) record(host int, blocks []uint64) {
	one := []byte{1}
	for _, h := range blocks {
		n.st.Set(n.key(host, h), one, 0)
	}
}

func (n *naiveIndex) query(hosts int, blocks []uint64, out []int) (gets, bytes int) {
	for p := 0; p < hosts; p++ {
		out[p] = 0
		for i, h := range blocks {
			v, _, err := n.st.Get(n.key(p, h))
			gets++
			if err != nil {
				break
			}
			bytes += len(v)
			out[p] = i + 1
		}
	}
	return gets, bytes
}

func fillChain(c []uint64, seed uint64) {
	h := seed*0x9E3779B97F4A7C15 + 1
	for i := range c {
		h ^= h >> 31
		h *= 0xBF58476D1CE4E5B9
		h ^= h >> 27
		c[i] = h
	}
}

// BenchmarkLayout sweeps the block size, the multi-resolution scheme and
// the segment length at 8K and 32K tokens with 64 hosts: the cost of one
// decision for a new prompt and for a repeated one, the sets per new
// prompt, and the precision lost on partial matches (the tokens between
// the true shared prefix, uniformly random, and the last block boundary
// below it). The defaults come from this table (docs/index.md, "Default block size").
func BenchmarkLayout(b *testing.B) {
	type layout struct {
		chars, levels, seg int
	}
	var layouts []layout
	for _, chars := range []int{64, 128, 256, 512, 1024} {
		for _, levels := range []int{-1, 32} {
			layouts = append(layouts, layout{chars, levels, 8})
		}
	}
	layouts = append(layouts, layout{256, 32, 1}, layout{256, 32, 16}, layout{256, 32, 32})
	for _, tokens := range []int{8 << 10, 32 << 10} {
		for _, l := range layouts {
			cfg := Config{Hash: HashConfig{BlockChars: l.chars, LevelBlocks: l.levels}, SegmentBlocks: l.seg}
			// Size the index to the same KV capacity in tokens for every
			// block size.
			cfg.Shards = SuggestShards(4096*64*256/l.chars*7/10, 0)
			name := fmt.Sprintf("tokens=%dK/chars=%d/levels=%d/seg=%d", tokens>>10, l.chars, l.levels, l.seg)
			f := newBenchFleet(b, 64, tokens, cfg, false)
			n := len(f.chain)
			c := make([]uint64, n)
			b.Run(name+"/new", func(b *testing.B) {
				var m Matches
				w0, by0 := f.ix.metrics.Writes, f.ix.metrics.BytesRead
				cpu0 := cpuNow()
				for i := 0; i < b.N; i++ {
					f.clk.ms += 5
					fillChain(c, uint64(i)<<32|uint64(tokens))
					f.ix.Query(c, &m)
					f.ix.Record(f.refs[i%64], c, &m)
				}
				b.StopTimer()
				reportCPU(b, cpu0)
				b.ReportMetric(float64(n), "blocks")
				b.ReportMetric(float64(f.ix.metrics.Writes-w0)/float64(b.N), "sets/op")
				b.ReportMetric(float64(f.ix.metrics.BytesRead-by0)/float64(b.N), "copiedB/op")
			})
			b.Run(name+"/repeat", func(b *testing.B) {
				var m Matches
				by0 := f.ix.metrics.BytesRead
				cpu0 := cpuNow()
				for i := 0; i < b.N; i++ {
					f.ix.Query(f.chain, &m)
					f.ix.Record(f.refs[0], f.chain, &m)
				}
				b.StopTimer()
				reportCPU(b, cpu0)
				b.ReportMetric(float64(f.ix.metrics.BytesRead-by0)/float64(b.N), "copiedB/op")
				// Precision: mean tokens lost below a uniformly random cut.
				h := NewHasher(f.ix.cfg.Hash)
				benchChain(h, 1, tokens)
				lost, cuts := 0, 0
				for cut := 0; cut < h.Len(); cut += 97 {
					below := 0
					for k := len(h.ends) - 1; k >= 0; k-- {
						if h.ends[k] <= cut {
							below = h.ends[k]
							break
						}
					}
					lost += cut - below
					cuts++
				}
				b.ReportMetric(float64(lost)/float64(cuts)/float64(h.cfg.CharsPerToken), "lostTok/match")
			})
		}
	}
}
