package router

import (
	"encoding/binary"
	"errors"
	"strconv"

	"github.com/kvroute/kvroute/index"
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
	m := &sharedMemory{st: store}
	m.get, _ = store.(index.AppendGetter)
	return m
}

func (m *sharedMemory) bucket(chain []uint64) string {
	return memoryKeys[(chain[memoryMinDepth-1]*0x9e3779b97f4a7c15)>>(64-12)]
}

func (m *sharedMemory) read(key string) {
	var v []byte
	var cas uint32
	var err error
	if m.get != nil {
		v, cas, err = m.get.GetAppend(m.buf[:0], key)
		if err == nil {
			m.buf = v
		}
	} else {
		v, cas, err = m.st.Get(key)
	}
	m.key, m.val, m.cas, m.found = key, v, cas, err == nil
	if err != nil {
		m.val = nil
	}
}

// lookup returns the host remembered at the deepest of chain's depths
// (8, 16, 32, ... blocks) that the bucket holds, "" when none.
func (m *sharedMemory) lookup(chain []uint64) string {
	m.key = ""
	if len(chain) < memoryMinDepth {
		return ""
	}
	m.read(m.bucket(chain))
	p := memoryMinDepth
	for p*2 <= len(chain) {
		p *= 2
	}
	for ; p >= memoryMinDepth; p /= 2 {
		if a, off, _ := findSession(m.val, chain[p-1]); off >= 0 {
			return string(a)
		}
	}
	return ""
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
		if m.holds(chain, addr) {
			return
		}
		out := m.out[:0]
		kept := 0
		p := memoryMinDepth
		for p*2 <= len(chain) {
			p *= 2
		}
		for ; p >= memoryMinDepth; p /= 2 {
			out = binary.LittleEndian.AppendUint64(out, chain[p-1])
			out = append(out, byte(len(addr)))
			out = append(out, addr...)
			kept++
		}
		v := m.val
		for i := 0; i+9 <= len(v) && kept < memoryPerBucket; {
			l := int(v[i+8])
			if i+9+l > len(v) {
				break
			}
			if !onChain(chain, binary.LittleEndian.Uint64(v[i:])) {
				out = append(out, v[i:i+9+l]...)
				kept++
			}
			i += 9 + l
		}
		m.out = out
		cas := m.cas
		if !m.found {
			cas = ^uint32(0) // create: fails if another worker created it first
		}
		err := m.st.Set(key, out, cas)
		if err == nil {
			m.key = ""
			return
		}
		if !errors.Is(err, index.ErrCASMismatch) || attempt == 3 {
			m.Contended++
			m.key = ""
			return
		}
		m.read(key)
	}
}

// holds reports whether the bucket read maps every depth of chain to addr.
func (m *sharedMemory) holds(chain []uint64, addr string) bool {
	for p := memoryMinDepth; p <= len(chain); p *= 2 {
		a, off, _ := findSession(m.val, chain[p-1])
		if off < 0 || string(a) != addr {
			return false
		}
	}
	return true
}

// onChain reports whether h is one of chain's memory keys.
func onChain(chain []uint64, h uint64) bool {
	for p := memoryMinDepth; p <= len(chain); p *= 2 {
		if chain[p-1] == h {
			return true
		}
	}
	return false
}
