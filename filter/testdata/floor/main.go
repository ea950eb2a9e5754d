//go:build wasip1

// Command floor is the least a body-routing proxy-wasm filter written in Go
// can do, against the raw ABI (no SDK): hold the request headers, buffer
// the body, read it into memory the module reuses, write the destination
// header (round robin over the plugin configuration's comma-separated
// addresses) and let every other callback return at once.
//
// BenchmarkRouterInWasm runs it in the same host and the same run as
// kvroute.router, so docs/performance.md can say what any Go filter that
// reads the body pays in this host (entering Go's Wasm runtime for eight
// callbacks, the body copy) and how much kvroute adds on top. It parses nothing.
package main

import (
	"strings"
	"unsafe"
)

func main() {}

//go:wasmimport env proxy_get_buffer_bytes
func proxyGetBufferBytes(t, start, max uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_replace_header_map_value
func proxyReplaceHeaderMapValue(t uint32, kp unsafe.Pointer, ks uint32, vp unsafe.Pointer, vs uint32) uint32

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

// scratch is the memory handed to the host for every buffer it returns:
// reused, as kvroute.router reuses its body buffer (filter/hostbuf).
var scratch []byte

//go:wasmexport proxy_on_memory_allocate
func onMemoryAllocate(size uint32) uint32 {
	if uint32(cap(scratch)) < size+1 {
		scratch = make([]byte, size+1)
	}
	return uint32(uintptr(unsafe.Pointer(&scratch[0])))
}

// touch, when set, runs on every routed body: the cold-code variant the
// benchmark generates (floor_test.go's coldFloorModule) sets it to run a
// known amount of code per request. sink keeps its result alive.
var (
	touch func(body []byte) uint64
	sink  uint64
)

var (
	addrs []string
	next  int
	key   = []byte("x-gateway-destination-endpoint")
)

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {}

//go:wasmexport proxy_on_vm_start
func onVMStart(id, size uint32) uint32 { return 1 }

//go:wasmexport proxy_on_configure
func onConfigure(id, size uint32) uint32 {
	var p, n uint32
	if proxyGetBufferBytes(7, 0, size, unsafe.Pointer(&p), unsafe.Pointer(&n)) != 0 {
		return 0
	}
	cfg := strings.Clone(unsafe.String((*byte)(unsafe.Pointer(uintptr(p))), n))
	addrs = strings.Split(cfg, ",")
	return 1
}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 {
	if eos == 0 {
		return 1 // hold the headers until the body is here
	}
	return 0
}

//go:wasmexport proxy_on_request_body
func onRequestBody(id, size, eos uint32) uint32 {
	if eos == 0 {
		return 1 // StopIterationAndBuffer
	}
	var p, n uint32
	if proxyGetBufferBytes(0, 0, size, unsafe.Pointer(&p), unsafe.Pointer(&n)) != 0 || len(addrs) == 0 {
		return 0
	}
	if touch != nil {
		sink += touch(unsafe.Slice((*byte)(unsafe.Pointer(uintptr(p))), n))
	}
	a := addrs[next%len(addrs)]
	next++
	proxyReplaceHeaderMapValue(0, unsafe.Pointer(&key[0]), uint32(len(key)), unsafe.Pointer(unsafe.StringData(a)), uint32(len(a)))
	return 0
}

//go:wasmexport proxy_on_response_headers
func onResponseHeaders(id, n, eos uint32) uint32 { return 0 }

//go:wasmexport proxy_on_response_body
func onResponseBody(id, size, eos uint32) uint32 { return 0 }

//go:wasmexport proxy_on_log
func onLog(id uint32) {}

//go:wasmexport proxy_on_done
func onDone(id uint32) uint32 { return 1 }

//go:wasmexport proxy_on_delete
func onDelete(id uint32) {}
