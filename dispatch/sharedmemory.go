package dispatch

import (
	"encoding/binary"
	"strconv"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scorer"
)

// sharedMemory is the prefix memory (see prefixMemory) in shared data, so
// that every worker of a gateway remembers what any of them routed: turn
// N+1 of a conversation finds turn N's host whichever worker handled turn
// N. Scope: one gateway; other gateways learn the routes from the merged
// reports, as prefix matches (docs/topology.md).
//
// Layout: memoryBuckets keys (a fixed key set: Envoy cannot delete a
// shared-data key). A prompt's entries all go to the bucket of its
// shallowest key (the hash of its first memoryMinDepth blocks), so one
// read answers a lookup at every depth and one compare-and-set stores a
// decision. Each entry is an 8-byte block hash, a length byte and the
// address; a bucket keeps its memoryPerBucket newest entries, so prompts
// that share their first 2 KB compete for one bucket's room, newest first.
type sharedMemory struct {
	st  index.Store
	get index.AppendGetter
	buf []byte
	out []byte
	// read is what lookup read, for store to reuse (valid while key
	// matches); cas is its CAS token.
	key   string
	val   []byte
	cas   uint32
	found bool
	// Contended counts stores dropped after the retries.
	Contended uint64
}

const (
	memoryBuckets    = 4096
	memoryPerBucket  = 48
	memoryKeyPrefix  = "kvroute/pmem/"
	memoryMaxAddrLen = 255
)

var memoryKeys = func() (k [memoryBuckets]string) {
	for i := range k {
		k[i] = memoryKeyPrefix + strconv.Itoa(i)
	}
	return k
}()

func newSharedMemory(store index.Store) *sharedMemory {
	return &sharedMemory{st: store, get: appendGetter(store)}
}

// appendGetter is store's GetAppend (reads into a caller's buffer, no
// allocation), or GetAppend over its Get when it has none.
func appendGetter(store index.Store) index.AppendGetter {
	if g, ok := store.(index.AppendGetter); ok {
		return g
	}
	return &getAppender{store}
}

// getAppender is GetAppend over a Store without it.
type getAppender struct{ s index.Store }

func (g *getAppender) GetAppend(dst []byte, key string) ([]byte, uint32, error) {
	v, cas, err := g.s.Get(key)
	if err != nil {
		return dst, 0, err
	}
	return append(dst, v...), cas, nil
}

func (m *sharedMemory) bucket(chain []uint64) string {
	return memoryKeys[(chain[memoryMinDepth-1]*0x9e3779b97f4a7c15)>>(64-12)]
}

// read reads key into m.val (nil when missing) and remembers it for
// store. Only a store that lost a compare-and-set calls it (noinline:
// lookup reads inline, and each function entered costs a request:
// docs/performance.md).
//
//go:noinline
func (m *sharedMemory) read(key string) {
	v, cas, err := m.get.GetAppend(m.buf[:0], key)
	if err == nil {
		m.buf = v
	} else {
		v = nil
	}
	m.key, m.val, m.cas, m.found = key, v, cas, err == nil
}

// lookup returns the position in hosts of the host remembered at the
// deepest of chain's depths (8, 16, 32, ... blocks) that the bucket holds
// and that hosts has, -1 when none. Returning a host rather than the
// stored address allocates nothing.
func (m *sharedMemory) lookup(chain []uint64, hosts []scorer.Host) int {
	m.key = ""
	if len(chain) < memoryMinDepth {
		return -1
	}
	key := m.bucket(chain)
	v, cas, err := m.get.GetAppend(m.buf[:0], key)
	if err == nil {
		m.buf = v
	} else {
		v = nil
	}
	m.key, m.val, m.cas, m.found = key, v, cas, err == nil
	if a, _ := deepest(v, chain); a != nil {
		for i := range hosts {
			if hosts[i].Address == string(a) {
				return i
			}
		}
	}
	return -1
}

// deepest returns the address of the bucket entry (v) at the deepest of
// chain's depths, and that depth (nil, 0 when none), in one pass over the
// bucket.
func deepest(v []byte, chain []uint64) (addr []byte, depth int) {
	for i := 0; i+9 <= len(v); {
		l := int(v[i+8])
		if i+9+l > len(v) {
			break
		}
		h := binary.LittleEndian.Uint64(v[i:])
		for p := memoryMinDepth; p <= len(chain); p *= 2 {
			if chain[p-1] == h && p > depth {
				addr, depth = v[i+9:i+9+l], p
			}
		}
		i += 9 + l
	}
	return addr, depth
}

// store remembers addr at every depth of chain, newest first in the
// bucket. Nothing is written when the bucket already says so.
func (m *sharedMemory) store(chain []uint64, addr string) {
	if len(chain) < memoryMinDepth || len(addr) > memoryMaxAddrLen {
		return
	}
	key := m.bucket(chain)
	if m.key != key {
		m.read(key)
	}
	for attempt := 0; ; attempt++ {
		// The deepest depth already names addr: the bucket says so
		// (a sibling prompt may have taken a shallower depth since;
		// the newest route wins there either way).
		p := memoryMinDepth
		for p*2 <= len(chain) {
			p *= 2
		}
		if a, d := deepest(m.val, chain); d == p && string(a) == addr {
			return
		}
		out := m.out[:0]
		kept := 0
		for ; p >= memoryMinDepth; p /= 2 {
			out = binary.LittleEndian.AppendUint64(out, chain[p-1])
			out = append(out, byte(len(addr)))
			out = append(out, addr...)
			kept++
		}
		// The older entries follow, less this chain's, copied a run of
		// kept entries at a time (one copy, not one per entry).
		v := m.val
		run := 0 // start of the current run of kept entries
		i := 0
		for i+9 <= len(v) && kept < memoryPerBucket {
			l := int(v[i+8])
			if i+9+l > len(v) {
				break
			}
			h, mine := binary.LittleEndian.Uint64(v[i:]), false
			for p := memoryMinDepth; p <= len(chain); p *= 2 {
				mine = mine || chain[p-1] == h
			}
			if mine {
				out = append(out, v[run:i]...)
				run = i + 9 + l
			} else {
				kept++
			}
			i += 9 + l
		}
		out = append(out, v[run:min(i, len(v))]...)
		m.out = out
		cas := m.cas
		if !m.found {
			cas = ^uint32(0) // create: fails if another worker created it first
		}
		if m.st.Set(key, out, cas) == nil {
			m.key = ""
			return
		}
		if attempt == 3 {
			m.Contended++
			m.key = ""
			return
		}
		m.read(key)
	}
}
