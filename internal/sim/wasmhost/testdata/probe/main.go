//go:build wasip1

// Command probe is a tiny proxy-wasm module written against the raw ABI
// (no SDK) that the wasmhost tests use to observe the host's Envoy
// semantics. Its behaviour is chosen by words in the plugin configuration
// and by x-probe-* request headers; it reports through metrics, response
// headers and shared data.
package main

import (
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

func main() {}

// started is when the module started, on the monotonic clock as well as
// the wall clock: time.Since(started) reads the monotonic one.
var started = time.Now()

// With PROBE_INIT_CALL set (vm_config.environment_variables), the module
// calls the host while _initialize runs, which Envoy forbids.
func init() {
	if os.Getenv("PROBE_INIT_CALL") != "" {
		proxySetTickPeriod(10)
	}
}

//go:wasmimport env proxy_log
func proxyLog(level uint32, ptr unsafe.Pointer, size uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func proxyGetBufferBytes(t, start, max uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_get_header_map_value
func proxyGetHeaderMapValue(t uint32, kp unsafe.Pointer, ks uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_get_header_map_pairs
func proxyGetHeaderMapPairs(t uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_replace_header_map_value
func proxyReplaceHeaderMapValue(t uint32, kp unsafe.Pointer, ks uint32, vp unsafe.Pointer, vs uint32) uint32

//go:wasmimport env proxy_add_header_map_value
func proxyAddHeaderMapValue(t uint32, kp unsafe.Pointer, ks uint32, vp unsafe.Pointer, vs uint32) uint32

//go:wasmimport env proxy_continue_stream
func proxyContinueStream(t uint32) uint32

//go:wasmimport env proxy_send_local_response
func proxySendLocalResponse(code uint32, dp unsafe.Pointer, ds uint32, bp unsafe.Pointer, bs uint32, hp unsafe.Pointer, hs uint32, grpc int32) uint32

//go:wasmimport env proxy_define_metric
func proxyDefineMetric(t uint32, np unsafe.Pointer, ns uint32, retID unsafe.Pointer) uint32

//go:wasmimport env proxy_increment_metric
func proxyIncrementMetric(id uint32, offset int64) uint32

//go:wasmimport env proxy_record_metric
func proxyRecordMetric(id uint32, value uint64) uint32

//go:wasmimport env proxy_get_shared_data
func proxyGetSharedData(kp unsafe.Pointer, ks uint32, retPtr, retSize, retCas unsafe.Pointer) uint32

//go:wasmimport env proxy_set_shared_data
func proxySetSharedData(kp unsafe.Pointer, ks uint32, vp unsafe.Pointer, vs uint32, cas uint32) uint32

//go:wasmimport env proxy_set_tick_period_milliseconds
func proxySetTickPeriod(ms uint32) uint32

//go:wasmimport env proxy_http_call
func proxyHTTPCall(up unsafe.Pointer, us uint32, hp unsafe.Pointer, hs uint32, bp unsafe.Pointer, bs uint32, tp unsafe.Pointer, ts uint32, timeout uint32, retToken unsafe.Pointer) uint32

//go:wasmimport env proxy_set_effective_context
func proxySetEffectiveContext(id uint32) uint32

//go:wasmimport env proxy_get_current_time_nanoseconds
func proxyGetCurrentTime(ret unsafe.Pointer) uint32

//go:wasmimport env proxy_get_property
func proxyGetProperty(pp unsafe.Pointer, ps uint32, retPtr, retSize unsafe.Pointer) uint32

// pinned keeps host-allocated buffers alive until the next callback.
var pinned [][]byte

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

//go:wasmexport proxy_on_memory_allocate
func onMemoryAllocate(size uint32) uint32 {
	b := make([]byte, size+1)
	pinned = append(pinned, b)
	return uint32(uintptr(unsafe.Pointer(&b[0])))
}

func enter() { pinned = pinned[:0] }

func ptr(s string) (unsafe.Pointer, uint32) {
	if len(s) == 0 {
		return nil, 0
	}
	b := []byte(s)
	return unsafe.Pointer(&b[0]), uint32(len(b))
}

func bytesAt(p, n uint32) string {
	if n == 0 {
		return ""
	}
	return string(unsafe.Slice((*byte)(unsafe.Pointer(uintptr(p))), n))
}

func logf(level uint32, msg string) {
	p, n := ptr(msg)
	proxyLog(level, p, n)
}

var metricIDs = map[string]uint32{}

func metric(kind uint32, name string) uint32 {
	if id, ok := metricIDs[name]; ok {
		return id
	}
	var id uint32
	p, n := ptr(name)
	proxyDefineMetric(kind, p, n, unsafe.Pointer(&id))
	metricIDs[name] = id
	return id
}

func inc(name string)              { proxyIncrementMetric(metric(0, name), 1) }
func record(name string, v uint64) { proxyRecordMetric(metric(2, name), v) }
func buffer(t uint32) (string, uint32) {
	var p, n uint32
	st := proxyGetBufferBytes(t, 0, 1<<30, unsafe.Pointer(&p), unsafe.Pointer(&n))
	return bytesAt(p, n), st
}

func header(t uint32, key string) (string, uint32) {
	var p, n uint32
	kp, kn := ptr(key)
	st := proxyGetHeaderMapValue(t, kp, kn, unsafe.Pointer(&p), unsafe.Pointer(&n))
	return bytesAt(p, n), st
}

func pairsCount(t uint32) (int, uint32) {
	var p, n uint32
	st := proxyGetHeaderMapPairs(t, unsafe.Pointer(&p), unsafe.Pointer(&n))
	if n < 4 {
		return 0, st
	}
	b := bytesAt(p, n)
	return int(uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24), st
}

func setHeader(t uint32, key, val string) uint32 {
	kp, kn := ptr(key)
	vp, vn := ptr(val)
	return proxyReplaceHeaderMapValue(t, kp, kn, vp, vn)
}

func addHeader(t uint32, key, val string) uint32 {
	kp, kn := ptr(key)
	vp, vn := ptr(val)
	return proxyAddHeaderMapValue(t, kp, kn, vp, vn)
}

func property(path ...string) (string, uint32) {
	var p, n uint32
	pp, pn := ptr(strings.Join(path, "\x00"))
	st := proxyGetProperty(pp, pn, unsafe.Pointer(&p), unsafe.Pointer(&n))
	return bytesAt(p, n), st
}

type root struct {
	config string
	words  map[string]bool
}

type stream struct {
	root        *root
	trapLater   bool
	bodyBytes   int
	configProbe uint32
}

var (
	roots   = map[uint32]*root{}
	streams = map[uint32]*stream{}
	callout = map[uint32]uint32{} // token -> stream context
)

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {
	enter()
	if parent == 0 {
		roots[id] = &root{words: map[string]bool{}}
		return
	}
	streams[id] = &stream{root: roots[parent]}
}

//go:wasmexport proxy_on_vm_start
func onVMStart(id, size uint32) uint32 {
	enter()
	return 1
}

//go:wasmexport proxy_on_configure
func onConfigure(id, size uint32) uint32 {
	enter()
	r := roots[id]
	cfg, st := buffer(7)
	if st != 0 {
		logf(4, "probe: plugin configuration unreadable in on_configure: status "+strconv.Itoa(int(st)))
		return 0
	}
	r.config = cfg
	for _, w := range strings.Split(cfg, ",") {
		r.words[strings.TrimSpace(w)] = true
	}
	if r.words["fail-configure"] {
		logf(5, `probe: invalid plugin configuration: field "mode": unknown value "fail-configure"`)
		return 0
	}
	if r.words["tick"] {
		proxySetTickPeriod(20)
	}
	if r.words["queue"] {
		qp, qn := ptr("probe.q")
		var tok uint32
		proxyRegisterSharedQueue(qp, qn, unsafe.Pointer(&tok))
	}
	return 1
}

//go:wasmexport proxy_on_queue_ready
func onQueueReady(rootID, token uint32) {
	enter()
	inc("probe.queue_ready")
	var p, n uint32
	for proxyDequeueSharedQueue(token, unsafe.Pointer(&p), unsafe.Pointer(&n)) == 0 {
		kp, kn := ptr("probe.q.last")
		vp, vn := ptr(bytesAt(p, n))
		proxySetSharedData(kp, kn, vp, vn, 0)
	}
}

//go:wasmexport proxy_on_tick
func onTick(id uint32) {
	enter()
	inc("probe.ticks")
}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 {
	enter()
	s := streams[id]
	inc("probe.request_headers")
	_, s.configProbe = buffer(7)
	if v, _ := header(0, "x-probe-abi"); v != "" {
		setHeader(0, "x-probe-abi-result", abiBattery())
	}
	if v, _ := header(0, "x-probe-clock"); v != "" {
		var now uint64
		proxyGetCurrentTime(unsafe.Pointer(&now))
		setHeader(0, "x-probe-proxy-now", strconv.FormatUint(now, 10))
		setHeader(0, "x-probe-wasi-now", strconv.FormatInt(time.Now().UnixNano(), 10))
		setHeader(0, "x-probe-since-start", strconv.FormatInt(int64(time.Since(started)), 10))
	}
	if v, _ := header(0, "x-probe-trap"); v != "" {
		panic("probe: trap requested")
	}
	if v, _ := header(0, "x-probe-local"); v != "" {
		code, _ := strconv.Atoi(v)
		d, dn := ptr("probe_local")
		b, bn := ptr("local reply")
		proxySendLocalResponse(uint32(code), d, dn, b, bn, nil, 0, -1)
		return 0 // the host must stop iteration anyway
	}
	if v, _ := header(0, "x-probe-callout"); v != "" {
		up, un := ptr(v)
		hdrs := pairs([][2]string{{":method", "GET"}, {":path", "/callout"}, {":authority", "callout"}})
		var tok uint32
		st := proxyHTTPCall(up, un, unsafe.Pointer(&hdrs[0]), uint32(len(hdrs)), nil, 0, nil, 0, 1000, unsafe.Pointer(&tok))
		if st != 0 {
			setHeader(0, "x-probe-callout-status", "dispatch-"+strconv.Itoa(int(st)))
			return 0
		}
		callout[tok] = id
		return 1
	}
	incrementShared("probe.count")
	if s.root.words["pause-headers"] && eos == 0 {
		return 1
	}
	return 0
}

func pairs(kv [][2]string) []byte {
	var b []byte
	le := func(x int) { b = append(b, byte(x), byte(x>>8), byte(x>>16), byte(x>>24)) }
	le(len(kv))
	for _, p := range kv {
		le(len(p[0]))
		le(len(p[1]))
	}
	for _, p := range kv {
		b = append(b, p[0]...)
		b = append(b, 0)
		b = append(b, p[1]...)
		b = append(b, 0)
	}
	return b
}

// incrementShared is a CAS loop on a decimal counter in shared data.
func incrementShared(key string) {
	kp, kn := ptr(key)
	for i := 0; i < 100; i++ {
		var p, n, cas uint32
		st := proxyGetSharedData(kp, kn, unsafe.Pointer(&p), unsafe.Pointer(&n), unsafe.Pointer(&cas))
		cur := 0
		if st == 0 {
			cur, _ = strconv.Atoi(bytesAt(p, n))
		}
		vp, vn := ptr(strconv.Itoa(cur + 1))
		if proxySetSharedData(kp, kn, vp, vn, cas) == 0 {
			return
		}
		inc("probe.cas_retries")
	}
}

//go:wasmexport proxy_on_http_call_response
func onHTTPCallResponse(rootID, token, nh, bodySize, nt uint32) {
	enter()
	id := callout[token]
	delete(callout, token)
	status, _ := header(6, ":status")
	body, _ := buffer(4)
	proxySetEffectiveContext(id)
	setHeader(0, "x-probe-callout-status", status)
	setHeader(0, "x-probe-callout-body", body)
	proxyContinueStream(0)
}

//go:wasmexport proxy_on_request_body
func onRequestBody(id, size, eos uint32) uint32 {
	enter()
	s := streams[id]
	inc("probe.request_body")
	if eos == 0 {
		return 1 // StopIterationAndBuffer
	}
	body, _ := buffer(0)
	s.bodyBytes = len(body)
	st := setHeader(0, "x-probe-body-len", strconv.Itoa(len(body)))
	setHeader(0, "x-probe-body-write", strconv.Itoa(int(st)))
	return 0
}

//go:wasmexport proxy_on_response_headers
func onResponseHeaders(id, n, eos uint32) uint32 {
	enter()
	s := streams[id]
	inc("probe.response_headers")
	lateWrite := setHeader(0, "x-probe-late", "1")
	_, lateRead := header(0, ":path")
	cnt, _ := pairsCount(0)
	_, pathProp := property("request", "path")
	up, upSt := property("upstream", "address")
	addHeader(2, "x-probe-late-write", strconv.Itoa(int(lateWrite)))
	addHeader(2, "x-probe-late-read", strconv.Itoa(int(lateRead)))
	addHeader(2, "x-probe-late-pairs", strconv.Itoa(cnt))
	addHeader(2, "x-probe-path-property", strconv.Itoa(int(pathProp)))
	addHeader(2, "x-probe-upstream", up+"/"+strconv.Itoa(int(upSt)))
	addHeader(2, "x-probe-config-outside-configure", strconv.Itoa(int(s.configProbe)))
	rid, _ := property("plugin_root_id")
	addHeader(2, "x-probe-root-id", rid)
	if s.root.words["pause-response"] && eos == 0 {
		return 1
	}
	return 0
}

//go:wasmexport proxy_on_response_body
func onResponseBody(id, size, eos uint32) uint32 {
	enter()
	s := streams[id]
	inc("probe.response_body")
	record("probe.response_chunk", uint64(size))
	if s.root.words["pause-response"] {
		if eos == 0 {
			return 1 // StopIterationAndBuffer
		}
		body, _ := buffer(1)
		setHeader(2, "x-probe-resp-body-len", strconv.Itoa(len(body)))
		up, un := ptr("[" + body + "]")
		proxySetBufferBytes(1, 0, uint32(len(body)), up, un)
		setHeader(2, "content-length", strconv.Itoa(len(body)+2))
	}
	return 0
}

//go:wasmexport proxy_on_log
func onLog(id uint32) {
	enter()
	inc("probe.log")
	if _, st := header(0, ":path"); st == 0 {
		inc("probe.log_path_readable")
	}
}

//go:wasmexport proxy_on_done
func onDone(id uint32) uint32 {
	enter()
	inc("probe.done")
	return 1
}

//go:wasmexport proxy_on_delete
func onDelete(id uint32) {
	enter()
	inc("probe.delete")
	delete(streams, id)
}
