package wasmhost

import (
	"sort"
	"sync"
)

// sharedData is Envoy's process-wide shared key-value store: one map per
// vm_id behind one mutex, values copied in and out. Keys cannot be deleted
// through the ABI. Every successful set stamps the entry with the next value
// of one global CAS counter, which starts at 1 and skips 0 when it wraps.
type sharedData struct {
	mu   sync.Mutex
	data map[string]map[string]sharedEntry
	cas  uint32
}

type sharedEntry struct {
	value []byte
	cas   uint32
}

func newSharedData() *sharedData {
	return &sharedData{data: map[string]map[string]sharedEntry{}, cas: 1}
}

func (s *sharedData) nextCas() uint32 {
	c := s.cas
	s.cas++
	if s.cas == 0 { // 0 is not a valid CAS value
		s.cas++
	}
	return c
}

// get returns a copy of the value and its CAS, or NotFound.
func (s *sharedData) get(vmID, key string) ([]byte, uint32, Status) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.data[vmID][key]
	if !ok {
		return nil, 0, StatusNotFound
	}
	return append([]byte(nil), e.value...), e.cas, StatusOK
}

// set follows proxy-wasm-cpp-host's SharedData::set: an existing key is
// replaced when cas is 0 or equals the stored CAS (else CasMismatch); a
// missing key is created whatever cas says.
func (s *sharedData) set(vmID, key string, value []byte, cas uint32) Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.data[vmID]
	if m == nil {
		m = map[string]sharedEntry{}
		s.data[vmID] = m
	}
	if e, ok := m[key]; ok && cas != 0 && cas != e.cas {
		return StatusCasMismatch
	}
	m[key] = sharedEntry{value: append([]byte(nil), value...), cas: s.nextCas()}
	return StatusOK
}

func (s *sharedData) keys(vmID string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.data[vmID]))
	for k := range s.data[vmID] {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// sharedQueues are Envoy's shared queues: keyed by (vm_id, name), tokens
// start at 1. Registering an existing name keeps its data but moves the
// on_queue_ready target to the registering VM's root context, as in
// proxy-wasm-cpp-host (the last worker to register wins).
type sharedQueues struct {
	mu     sync.Mutex
	tokens map[[2]string]uint32
	queues map[uint32]*sharedQueue
	next   uint32
}

type sharedQueue struct {
	items  [][]byte
	owner  *vm
	rootID uint32
}

func newSharedQueues() *sharedQueues {
	return &sharedQueues{tokens: map[[2]string]uint32{}, queues: map[uint32]*sharedQueue{}, next: 1}
}

func (q *sharedQueues) register(vmID, name string, owner *vm, rootID uint32) uint32 {
	q.mu.Lock()
	defer q.mu.Unlock()
	key := [2]string{vmID, name}
	tok, ok := q.tokens[key]
	if !ok {
		for {
			tok = q.next
			q.next++
			if tok != 0 && q.queues[tok] == nil {
				break
			}
		}
		q.tokens[key] = tok
		q.queues[tok] = &sharedQueue{}
	}
	q.queues[tok].owner = owner
	q.queues[tok].rootID = rootID
	return tok
}

func (q *sharedQueues) resolve(vmID, name string) uint32 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.tokens[[2]string{vmID, name}]
}

func (q *sharedQueues) dequeue(tok uint32) ([]byte, Status) {
	q.mu.Lock()
	defer q.mu.Unlock()
	sq := q.queues[tok]
	if sq == nil {
		return nil, StatusNotFound
	}
	if len(sq.items) == 0 {
		return nil, StatusEmpty
	}
	v := sq.items[0]
	sq.items = sq.items[1:]
	return v, StatusOK
}

// enqueue appends a copy of value and returns who must get on_queue_ready.
func (q *sharedQueues) enqueue(tok uint32, value []byte) (*vm, uint32, Status) {
	q.mu.Lock()
	defer q.mu.Unlock()
	sq := q.queues[tok]
	if sq == nil {
		return nil, 0, StatusNotFound
	}
	sq.items = append(sq.items, append([]byte(nil), value...))
	return sq.owner, sq.rootID, StatusOK
}
