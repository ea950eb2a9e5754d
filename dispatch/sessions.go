package dispatch

import "github.com/cespare/xxhash/v2"

// MemSessions is a bounded in-memory SessionTable. It keeps two
// generations of pins: lookups promote a pin from the old generation to the
// current one, and when the current one fills up the old one is dropped.
// That approximates LRU with two maps and no per-entry bookkeeping. Keys
// are stored as 64-bit hashes: the table never holds what clients sent.
type MemSessions struct {
	capacity int
	cur, old map[uint64]string
}

// NewMemSessions returns a table holding at least capacity recent sessions
// (and at most twice that).
func NewMemSessions(capacity int) *MemSessions {
	if capacity < 1 {
		capacity = 1
	}
	return &MemSessions{capacity: capacity, cur: map[uint64]string{}, old: map[uint64]string{}}
}

// Get implements SessionTable.
func (s *MemSessions) Get(key string) (string, bool) {
	k := xxhash.Sum64String(key)
	if a, ok := s.cur[k]; ok {
		return a, true
	}
	if a, ok := s.old[k]; ok {
		s.put(k, a)
		return a, true
	}
	return "", false
}

// Put implements SessionTable.
func (s *MemSessions) Put(key, address string) { s.put(xxhash.Sum64String(key), address) }

func (s *MemSessions) put(k uint64, a string) {
	if _, ok := s.cur[k]; !ok && len(s.cur) >= s.capacity {
		s.old, s.cur = s.cur, make(map[uint64]string, s.capacity)
	}
	s.cur[k] = a
}

// Len returns the number of pins held.
func (s *MemSessions) Len() int { return len(s.cur) + len(s.old) }
