package dispatch

import (
	"encoding/binary"
	"errors"
	"strconv"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/index"
)

// SharedSessions is a SessionTable in shared data, so that every Envoy
// worker of a gateway (each its own VM, each with its own Dispatcher) reads and
// writes the same pins: a conversation's follow-up lands on its session's
// host whichever worker the kernel hands its connection to.
//
// Scope: one gateway (the shared-data map of the vm_id). Other gateways
// keep their own table; a session that moves to another gateway finds no
// pin there and is routed on prefix matches, which the merged gateway
// reports carry (docs/topology.md).
//
// Layout: SessionBuckets keys (Envoy cannot delete a shared-data key, so
// the key set is fixed), each holding up to SessionsPerBucket entries,
// newest first: an 8-byte hash of the session key, a length byte and the
// address. A bucket that fills drops its oldest pin, which approximates
// LRU per bucket. Keys are stored as hashes: the table never holds what
// clients sent. Writes are compare-and-set with bounded retries; a pin
// lost to contention is a hint lost, never an error for the request.
type SharedSessions struct {
	store index.Store
	get   index.AppendGetter // store's GetAppend, or getAppender over its Get
	buf   []byte             // read buffer, reused
	out   []byte             // write buffer, reused
	// Contended counts pins dropped after the retries.
	Contended uint64
}

const (
	// SessionBuckets x SessionsPerBucket is the table's capacity (65,536,
	// as MemSessions' default).
	SessionBuckets    = 2048
	SessionsPerBucket = 32
	sessionKeyPrefix  = "kvroute/sess/"
	maxSessionAddr    = 255
)

// sessionKeys are the bucket keys, built once.
var sessionKeys = func() (k [SessionBuckets]string) {
	for i := range k {
		k[i] = sessionKeyPrefix + strconv.Itoa(i)
	}
	return k
}()

// NewSharedSessions returns a session table over store (shared data in the
// filter, the gateway's MemStore in the simulator).
func NewSharedSessions(store index.Store) *SharedSessions {
	return &SharedSessions{store: store, get: appendGetter(store)}
}

func sessionBucket(h uint64) string { return sessionKeys[h%SessionBuckets] }

func (s *SharedSessions) read(key string) ([]byte, uint32, bool) {
	v, cas, err := s.get.GetAppend(s.buf[:0], key)
	if err != nil {
		return nil, 0, false
	}
	s.buf = v
	return v, cas, true
}

// find returns the address stored for h in bucket v ("" when none) and the
// entry's offset and length (-1 when none).
func findSession(v []byte, h uint64) (addr []byte, off, n int) {
	for i := 0; i+9 <= len(v); {
		l := int(v[i+8])
		if i+9+l > len(v) {
			break // a torn or foreign value: treat the rest as empty
		}
		if binary.LittleEndian.Uint64(v[i:]) == h {
			return v[i+9 : i+9+l], i, 9 + l
		}
		i += 9 + l
	}
	return nil, -1, 0
}

// Get implements SessionTable.
func (s *SharedSessions) Get(key string) (string, bool) {
	h := xxhash.Sum64String(key)
	v, _, ok := s.read(sessionBucket(h))
	if !ok {
		return "", false
	}
	a, off, _ := findSession(v, h)
	if off < 0 {
		return "", false
	}
	return string(a), true
}

// Put implements SessionTable: the pin goes first in its bucket, replacing
// the key's previous pin, and the bucket keeps its SessionsPerBucket newest.
func (s *SharedSessions) Put(key, address string) {
	if len(address) > maxSessionAddr {
		return
	}
	h := xxhash.Sum64String(key)
	bk := sessionBucket(h)
	for range 8 {
		v, cas, ok := s.read(bk)
		if !ok {
			// Create: a CAS no stored key has, so that two workers
			// creating the bucket at once cannot both succeed.
			v, cas = nil, ^uint32(0)
		}
		out := s.out[:0]
		out = binary.LittleEndian.AppendUint64(out, h)
		out = append(out, byte(len(address)))
		out = append(out, address...)
		kept := 1
		for i := 0; i+9 <= len(v) && kept < SessionsPerBucket; {
			l := int(v[i+8])
			if i+9+l > len(v) {
				break
			}
			if binary.LittleEndian.Uint64(v[i:]) != h {
				out = append(out, v[i:i+9+l]...)
				kept++
			}
			i += 9 + l
		}
		s.out = out
		err := s.store.Set(bk, out, cas)
		if err == nil {
			return
		}
		if !errors.Is(err, index.ErrCASMismatch) {
			break
		}
	}
	s.Contended++
}
