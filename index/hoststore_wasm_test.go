//go:build wasip1 && kvroute_hoststore

package index

import (
	"time"
	"unsafe"
)

// hostStore keeps shared data on the host, as Envoy does: a get is a host
// call that copies the value into a fresh guest buffer (the SDK allocates
// it through proxy_on_memory_allocate), a set copies it out. The host
// side is index/internal/wasmexec's "kvroute_store" module. Build with
// -tags kvroute_hoststore to measure the index in Wasm with the map where
// Envoy keeps it; without the tag, the Wasm benchmarks use MemStore
// compiled to Wasm, which overstates the cost of a get.

//go:wasmimport kvroute_store get
func hostGet(key unsafe.Pointer, keyLen uint32, buf unsafe.Pointer, bufCap uint32, cas unsafe.Pointer) int32

//go:wasmimport kvroute_store set
func hostSet(key unsafe.Pointer, keyLen uint32, val unsafe.Pointer, valLen uint32, cas uint32) int32

type hostStore struct{ scratch []byte }

func (h *hostStore) Get(key string) ([]byte, uint32, error) {
	if h.scratch == nil {
		h.scratch = make([]byte, 0, 1<<16)
	}
	v, cas, err := h.GetAppend(h.scratch, key)
	h.scratch = v[:0]
	if err != nil {
		return nil, 0, err
	}
	// A fresh slice per get, as the SDK allocates one in Envoy.
	return append([]byte(nil), v...), cas, nil
}

// GetAppend is what the filter's store does with filter/hostbuf: the host
// copies the value straight into dst's array when it fits.
func (h *hostStore) GetAppend(dst []byte, key string) ([]byte, uint32, error) {
	dst = dst[:0]
	var cas uint32
	for {
		var p unsafe.Pointer
		if cap(dst) > 0 {
			p = unsafe.Pointer(&dst[:1][0])
		}
		n := hostGet(unsafe.Pointer(unsafe.StringData(key)), uint32(len(key)), p, uint32(cap(dst)), unsafe.Pointer(&cas))
		if n < 0 {
			return dst, 0, ErrNotFound
		}
		if int(n) > cap(dst) {
			dst = make([]byte, 0, n) // as the bridge allocates when the lent buffer is too small
			continue
		}
		return dst[:n], cas, nil
	}
}

func (h *hostStore) Set(key string, value []byte, cas uint32) error {
	var p unsafe.Pointer
	if len(value) > 0 {
		p = unsafe.Pointer(&value[0])
	}
	if hostSet(unsafe.Pointer(unsafe.StringData(key)), uint32(len(key)), p, uint32(len(value)), cas) != 0 {
		return ErrCASMismatch
	}
	return nil
}

//go:wasmimport kvroute_store reset
func hostReset()

func benchStore() Store { return &hostStore{} }

// resetBenchStore empties the host's map: every hostStore shares it.
func resetBenchStore() { hostReset() }

//go:wasmimport kvroute_store cpu_ns
func hostCPU() int64

// cpuNow returns the CPU time of the host process running this guest.
func cpuNow() time.Duration { return time.Duration(hostCPU()) }
