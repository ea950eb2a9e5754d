package index

import (
	"errors"
	"sync"
)

// Store is the slice of proxy-wasm shared data the index needs: a
// process-wide key/value map with compare-and-set.
//
// The filter adapts the SDK's GetSharedData/SetSharedData to it; tests,
// benchmarks and the fleet simulator use MemStore. Implementations must
// return a value the caller may keep and modify (Envoy copies it into the
// VM anyway) and must copy the value passed to Set (the index reuses its
// encode buffer).
type Store interface {
	// Get returns the value stored under key and its CAS token, or an
	// error wrapping ErrNotFound when the key was never set.
	Get(key string) (value []byte, cas uint32, err error)
	// Set stores value under key if cas is 0, the key is missing, or cas
	// equals the key's current token; otherwise it returns an error
	// wrapping ErrCASMismatch and changes nothing.
	Set(key string, value []byte, cas uint32) error
}

// AppendGetter is an optional extension of Store: a Get that copies the
// value into a buffer the caller supplies instead of a fresh one.
//
// Why: a routing decision for a new 8K-token prompt reads about a dozen
// shards of up to 1 KB each, and a fresh slice per read costs more than
// the copy itself (allocation, then garbage collection: a quarter of the
// decision's CPU natively). The index keeps one buffer per shard a query
// reads and a few scratch buffers, and passes them back on every read, so
// its hot paths (Query's shard reads, Record's shard updates, the slot
// stamp, the usage histogram) allocate nothing once warm.
//
// A Store without it keeps working: the index falls back to Get.
type AppendGetter interface {
	// GetAppend appends the value stored under key to dst and returns the
	// extended slice (a new array when dst lacks capacity) with the key's
	// CAS token, as Get does; on error it returns dst unchanged and an
	// error wrapping ErrNotFound when the key was never set. The index
	// passes dst[:0] of a buffer it owns and reuses the result for later
	// reads, so the returned slice must not alias the Store's own copy.
	GetAppend(dst []byte, key string) (value []byte, cas uint32, err error)
}

// getAppender is AppendGetter over a Store without one, so that the index
// reads every key through one call (see Index.getInto). Into an empty dst,
// as the index reads, it returns the fresh slice Get made instead of
// copying it again.
type getAppender struct{ s Store }

func (g *getAppender) GetAppend(dst []byte, key string) ([]byte, uint32, error) {
	v, cas, err := g.s.Get(key)
	if err != nil {
		return dst, 0, err
	}
	if len(dst) == 0 {
		return v, cas, nil
	}
	return append(dst, v...), cas, nil
}

var (
	// ErrNotFound reports a key that has never been set. Envoy cannot
	// delete shared-data keys, so a key once set stays found.
	ErrNotFound = errors.New("index: shared data key not found")
	// ErrCASMismatch reports that another writer changed the key since it
	// was read; read it again and retry.
	ErrCASMismatch = errors.New("index: shared data CAS mismatch (concurrent update); re-read and retry")
)

// MemStore is an in-memory Store with Envoy's exact shared-data rules, for
// tests, benchmarks and the simulator:
//
//   - one map behind one mutex (Envoy's SharedData is exactly that);
//   - CAS 0 sets unconditionally, and a missing key is set whatever CAS is
//     given (the SDK's proxytest emulator differs on both; Envoy is the
//     reference);
//   - every successful Set assigns the next value of one global counter
//     that skips 0, so a CAS token never repeats for a key while the
//     counter does not wrap;
//   - Get returns a copy, as Envoy copies the value into the VM;
//     GetAppend (AppendGetter) copies it into the caller's buffer.
//
// The zero value is ready to use and safe for concurrent use.
type MemStore struct {
	mu      sync.Mutex
	entries map[string]memEntry
	nextCAS uint32
}

type memEntry struct {
	value []byte
	cas   uint32
}

// Get implements Store.
func (m *MemStore) Get(key string) ([]byte, uint32, error) {
	m.mu.Lock()
	e, ok := m.entries[key]
	if !ok {
		m.mu.Unlock()
		return nil, 0, ErrNotFound
	}
	v := make([]byte, len(e.value))
	copy(v, e.value)
	m.mu.Unlock()
	return v, e.cas, nil
}

// GetAppend implements AppendGetter.
func (m *MemStore) GetAppend(dst []byte, key string) ([]byte, uint32, error) {
	m.mu.Lock()
	e, ok := m.entries[key]
	if !ok {
		m.mu.Unlock()
		return dst, 0, ErrNotFound
	}
	dst = append(dst, e.value...)
	m.mu.Unlock()
	return dst, e.cas, nil
}

// Set implements Store.
func (m *MemStore) Set(key string, value []byte, cas uint32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.entries == nil {
		m.entries = make(map[string]memEntry)
	}
	e, ok := m.entries[key]
	if ok && cas != 0 && cas != e.cas {
		return ErrCASMismatch
	}
	// Reuse the stored buffer when it is large enough: the simulator
	// rewrites the same shard keys millions of times.
	buf := e.value[:0]
	if cap(buf) < len(value) {
		buf = make([]byte, 0, len(value))
	}
	buf = append(buf, value...)
	m.nextCAS++
	if m.nextCAS == 0 {
		m.nextCAS = 1
	}
	m.entries[key] = memEntry{value: buf, cas: m.nextCAS}
	return nil
}

// Len reports the number of keys and the total bytes of their values, for
// memory-per-block measurements.
func (m *MemStore) Len() (keys, bytes int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, e := range m.entries {
		keys++
		bytes += len(k) + len(e.value)
	}
	return keys, bytes
}
