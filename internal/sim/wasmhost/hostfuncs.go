package wasmhost

import (
	"context"
	"encoding/binary"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

const i32, i64 = api.ValueTypeI32, api.ValueTypeI64

// hostFunc is an env.proxy_* implementation. It reads its i32 arguments
// from p and returns the ABI status.
type hostFunc func(v *vm, p []uint64) Status

func u32(x uint64) uint32 { return uint32(x) }

// instantiateHostModules defines the "env" module with the proxy-wasm ABI
// 0.2.1 host functions and "wasi_snapshot_preview1" with wazero's WASI, with
// poll_oneoff and proc_exit behaving as in Envoy.
func instantiateHostModules(ctx context.Context, r wazero.Runtime, stats *callStats) error {
	env := r.NewHostModuleBuilder("env")
	def := func(name string, params []api.ValueType, fn hostFunc) {
		restrictedOK := name == "proxy_log"
		st := stats.get(name, "host")
		env.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, _ api.Module, stack []uint64) {
			v := vmFrom(ctx)
			if v.restricted && !restrictedOK {
				panic(vmTrap{"restricted_callback: Attempted call to restricted proxy-wasm capability during _initialize: " + name})
			}
			t0 := time.Now()
			stack[0] = uint64(fn(v, stack[:len(params)]))
			st.add(time.Since(t0))
		}), params, []api.ValueType{i32}).Export(name)
	}
	n := func(k int) []api.ValueType {
		ps := make([]api.ValueType, k)
		for i := range ps {
			ps[i] = i32
		}
		return ps
	}
	def("proxy_log", n(3), hLog)
	def("proxy_get_log_level", n(1), hGetLogLevel)
	def("proxy_get_status", n(3), hGetStatus)
	def("proxy_set_property", n(4), hSetProperty)
	def("proxy_get_property", n(4), hGetProperty)
	def("proxy_send_local_response", n(8), hSendLocalResponse)
	def("proxy_get_shared_data", n(5), hGetSharedData)
	def("proxy_set_shared_data", n(5), hSetSharedData)
	def("proxy_register_shared_queue", n(3), hRegisterQueue)
	def("proxy_resolve_shared_queue", n(5), hResolveQueue)
	def("proxy_dequeue_shared_queue", n(3), hDequeue)
	def("proxy_enqueue_shared_queue", n(3), hEnqueue)
	def("proxy_get_header_map_value", n(5), hGetHeaderValue)
	def("proxy_add_header_map_value", n(5), hAddHeaderValue)
	def("proxy_replace_header_map_value", n(5), hReplaceHeaderValue)
	def("proxy_remove_header_map_value", n(3), hRemoveHeaderValue)
	def("proxy_get_header_map_pairs", n(3), hGetHeaderPairs)
	def("proxy_set_header_map_pairs", n(3), hSetHeaderPairs)
	def("proxy_get_header_map_size", n(2), hGetHeaderSize)
	def("proxy_get_buffer_status", n(3), hGetBufferStatus)
	def("proxy_get_buffer_bytes", n(5), hGetBufferBytes)
	def("proxy_set_buffer_bytes", n(5), hSetBufferBytes)
	def("proxy_http_call", n(10), hHTTPCall)
	def("proxy_grpc_call", n(12), hGrpcOpen(0, 1))
	def("proxy_grpc_stream", n(9), hGrpcOpen(0, 1))
	def("proxy_grpc_close", n(1), hGrpcToken)
	def("proxy_grpc_cancel", n(1), hGrpcToken)
	def("proxy_grpc_send", n(4), hGrpcToken)
	def("proxy_set_tick_period_milliseconds", n(1), hSetTickPeriod)
	def("proxy_get_current_time_nanoseconds", n(1), hGetCurrentTime)
	def("proxy_define_metric", n(4), hDefineMetric)
	def("proxy_increment_metric", []api.ValueType{i32, i64}, hIncrementMetric)
	def("proxy_record_metric", []api.ValueType{i32, i64}, hRecordMetric)
	def("proxy_get_metric", n(2), hGetMetric)
	def("proxy_set_effective_context", n(1), hSetEffectiveContext)
	def("proxy_done", n(0), hDone)
	def("proxy_call_foreign_function", n(6), hCallForeign)
	def("proxy_continue_stream", n(1), hContinueStream)
	def("proxy_close_stream", n(1), hCloseStream)
	env.NewFunctionBuilder().WithFunc(func(a, b uint32) uint32 {
		if a == b {
			return 1
		}
		return 0
	}).Export("pthread_equal")
	env.NewFunctionBuilder().WithFunc(func(uint32) {}).Export("emscripten_notify_memory_growth")
	if _, err := env.Instantiate(ctx); err != nil {
		return err
	}

	wasi := r.NewHostModuleBuilder(wasi_snapshot_preview1.ModuleName)
	wasi_snapshot_preview1.NewFunctionExporter().ExportFunctions(wasi)
	// Envoy (proxy-wasm-cpp-host) answers poll_oneoff at once with no
	// events and success: the Go runtime needs ESUCCESS, and a VM never
	// sleeps on a worker thread.
	wasi.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, stack []uint64) {
		v := vmFrom(ctx)
		if v.h.cfg.PollOneoffUnsupported {
			stack[0] = 52 // ENOSYS, as hosts without the fix answer
			return
		}
		if !m.Memory().WriteUint32Le(u32(stack[3]), 0) {
			stack[0] = 21 // EFAULT
			return
		}
		stack[0] = 0
	}), n(4), []api.ValueType{i32}).Export("poll_oneoff")
	// proc_exit ends the module: Go calls it after an unrecovered panic.
	// The VM traps and is marked failed.
	wasi.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, stack []uint64) {
		panic(vmTrap{"proc_exit(" + itoa(int64(u32(stack[0]))) + ") called by the module"})
	}), n(1), nil).Export("proc_exit")
	_, err := wasi.Instantiate(ctx)
	return err
}

func itoa(x int64) string {
	if x == 0 {
		return "0"
	}
	neg := x < 0
	if neg {
		x = -x
	}
	var b [20]byte
	i := len(b)
	for x > 0 {
		i--
		b[i] = byte('0' + x%10)
		x /= 10
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}

// Logging.

func hLog(v *vm, p []uint64) Status {
	level := u32(p[0])
	if level > levelMax {
		return StatusBadArgument
	}
	msg, ok := v.readString(u32(p[1]), u32(p[2]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	if level == levelMax {
		level = LevelCritical
	}
	v.log(int(level), v.active(), msg)
	return StatusOK
}

func hGetLogLevel(v *vm, p []uint64) Status {
	if !v.mem.WriteUint32Le(u32(p[0]), uint32(v.h.cfg.LogLevel)) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func hGetStatus(v *vm, p []uint64) Status {
	root := v.active().rootCtx()
	if !v.mem.WriteUint32Le(u32(p[0]), root.status) {
		return StatusInvalidMemoryAccess
	}
	return v.copyOut([]byte(root.statusMsg), u32(p[1]), u32(p[2]))
}

// Properties.

func hSetProperty(v *vm, p []uint64) Status {
	key, ok1 := v.readString(u32(p[0]), u32(p[1]))
	val, ok2 := v.read(u32(p[2]), u32(p[3]))
	if !ok1 || !ok2 {
		return StatusInvalidMemoryAccess
	}
	c := v.active()
	if c.s == nil { // no stream info on a root context
		return StatusNotFound
	}
	c.s.setProperty(key, val)
	return StatusOK
}

func hGetProperty(v *vm, p []uint64) Status {
	path, ok := v.readString(u32(p[0]), u32(p[1]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	val, st := v.property(v.active(), path)
	if st != StatusOK {
		return st
	}
	return v.copyOut(val, u32(p[2]), u32(p[3]))
}

// Local responses and stream control.

func hSendLocalResponse(v *vm, p []uint64) Status {
	details, ok1 := v.readString(u32(p[1]), u32(p[2]))
	body, ok2 := v.read(u32(p[3]), u32(p[4]))
	hdrs, ok3 := v.read(u32(p[5]), u32(p[6]))
	if !ok1 || !ok2 || !ok3 {
		return StatusInvalidMemoryAccess
	}
	c := v.active()
	code := int(u32(p[0]))
	extra := decodePairs(hdrs)
	if s := c.s; s != nil {
		v.defer_(func() {
			s.post(event{kind: evLocalReply, ctx: c, code: code, body: body, headers: extra, details: strings.ReplaceAll(details, " ", "_")})
		})
	}
	v.stopNext = true
	return StatusOK
}

func hContinueStream(v *vm, p []uint64) Status {
	t := u32(p[0])
	if t > streamMax {
		return StatusBadArgument
	}
	c := v.active()
	switch t {
	case streamRequest, streamResponse:
		if s := c.s; s != nil {
			kind := evContinueRequest
			if t == streamResponse {
				kind = evContinueResponse
			}
			v.defer_(func() { s.post(event{kind: kind, ctx: c}) })
		}
		// Envoy drops the request maps on either direction's continue.
		c.reqHeaders, c.reqBody = nil, nil
		return StatusOK
	case streamDownstream:
		return StatusOK
	default:
		return StatusUnimplemented
	}
}

func hCloseStream(v *vm, p []uint64) Status {
	t := u32(p[0])
	if t > streamMax {
		return StatusBadArgument
	}
	c := v.active()
	if (t == streamRequest || t == streamResponse) && c.s != nil {
		s := c.s
		v.defer_(func() { s.post(event{kind: evReset, details: "wasm_close_stream"}) })
	}
	return StatusOK
}

// Shared data and queues.

func hGetSharedData(v *vm, p []uint64) Status {
	key, ok := v.readString(u32(p[0]), u32(p[1]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	val, cas, st := v.h.shared.get(v.h.cfg.VMID, key)
	if st != StatusOK {
		return st
	}
	if st := v.copyOut(val, u32(p[2]), u32(p[3])); st != StatusOK {
		return st
	}
	if !v.mem.WriteUint32Le(u32(p[4]), cas) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func hSetSharedData(v *vm, p []uint64) Status {
	key, ok1 := v.readString(u32(p[0]), u32(p[1]))
	val, ok2 := v.read(u32(p[2]), u32(p[3]))
	if !ok1 || !ok2 {
		return StatusInvalidMemoryAccess
	}
	return v.h.shared.set(v.h.cfg.VMID, key, val, u32(p[4]))
}

func hRegisterQueue(v *vm, p []uint64) Status {
	name, ok := v.readString(u32(p[0]), u32(p[1]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	root := v.active().rootCtx()
	tok := v.h.queues.register(v.h.cfg.VMID, name, v, root.id)
	if !v.mem.WriteUint32Le(u32(p[2]), tok) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func hResolveQueue(v *vm, p []uint64) Status {
	vmID, ok1 := v.readString(u32(p[0]), u32(p[1]))
	name, ok2 := v.readString(u32(p[2]), u32(p[3]))
	if !ok1 || !ok2 {
		return StatusInvalidMemoryAccess
	}
	if vmID == "" {
		vmID = v.h.cfg.VMID
	}
	tok := v.h.queues.resolve(vmID, name)
	if tok == 0 {
		return StatusNotFound
	}
	if !v.mem.WriteUint32Le(u32(p[4]), tok) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func hDequeue(v *vm, p []uint64) Status {
	val, st := v.h.queues.dequeue(u32(p[0]))
	if st != StatusOK {
		return st
	}
	return v.copyOut(val, u32(p[1]), u32(p[2]))
}

func hEnqueue(v *vm, p []uint64) Status {
	val, ok := v.read(u32(p[1]), u32(p[2]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	owner, rootID, st := v.h.queues.enqueue(u32(p[0]), val)
	if st != StatusOK {
		return st
	}
	v.h.notifyQueue(owner, rootID, u32(p[0]))
	return StatusOK
}

// Header maps.

// readMap returns the map a read sees: in on_log the final maps of the
// stream; otherwise the live map, nil once that direction's headers have
// continued.
func (v *vm) readMap(c *wctx, t uint32) *headerMap {
	switch t {
	case mapRequestHeaders:
		if c.accessLog {
			return c.s.logReqHeaders()
		}
		return c.reqHeaders
	case mapResponseHeaders:
		if c.accessLog {
			return c.s.logRespHeaders()
		}
		return c.respHeaders
	case mapHTTPCallResponseHeaders:
		if r := c.rootCtx().callResp; r != nil {
			return r.headers
		}
	case mapHTTPCallResponseTrailer:
		if r := c.rootCtx().callResp; r != nil {
			return r.trailers
		}
	}
	return nil // trailers and gRPC metadata never exist in this host
}

// writeMap returns the map a write changes; nil means BadArgument.
func (v *vm) writeMap(c *wctx, t uint32) *headerMap {
	switch t {
	case mapRequestHeaders:
		return c.reqHeaders
	case mapResponseHeaders:
		return c.respHeaders
	}
	return nil
}

func hGetHeaderValue(v *vm, p []uint64) Status {
	t := u32(p[0])
	if t > mapMax {
		return StatusBadArgument
	}
	key, ok := v.readString(u32(p[1]), u32(p[2]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	c := v.active()
	m := v.readMap(c, t)
	if m == nil {
		if c.accessLog {
			return StatusNotFound
		}
		return StatusBadArgument
	}
	val, found := m.get(key)
	if !found {
		return StatusNotFound
	}
	return v.copyOut([]byte(val), u32(p[3]), u32(p[4]))
}

func (v *vm) mutate(p []uint64, nargs int, f func(m *headerMap, key, val string)) Status {
	t := u32(p[0])
	if t > mapMax {
		return StatusBadArgument
	}
	key, ok := v.readString(u32(p[1]), u32(p[2]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	val := ""
	if nargs == 5 {
		if val, ok = v.readString(u32(p[3]), u32(p[4])); !ok {
			return StatusInvalidMemoryAccess
		}
	}
	m := v.writeMap(v.active(), t)
	if m == nil {
		return StatusBadArgument
	}
	f(m, key, val)
	return StatusOK
}

func hAddHeaderValue(v *vm, p []uint64) Status {
	return v.mutate(p, 5, func(m *headerMap, k, val string) { m.add(k, val) })
}

func hReplaceHeaderValue(v *vm, p []uint64) Status {
	return v.mutate(p, 5, func(m *headerMap, k, val string) { m.replace(k, val) })
}

func hRemoveHeaderValue(v *vm, p []uint64) Status {
	return v.mutate(p, 3, func(m *headerMap, k, _ string) { m.remove(k) })
}

func hGetHeaderPairs(v *vm, p []uint64) Status {
	t := u32(p[0])
	if t > mapMax {
		return StatusBadArgument
	}
	var pairs []Pair
	if m := v.readMap(v.active(), t); m != nil {
		pairs = m.pairs
	}
	return v.copyOut(encodePairs(pairs), u32(p[1]), u32(p[2]))
}

func hSetHeaderPairs(v *vm, p []uint64) Status {
	t := u32(p[0])
	if t > mapMax {
		return StatusBadArgument
	}
	data, ok := v.read(u32(p[1]), u32(p[2]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	m := v.writeMap(v.active(), t)
	if m == nil {
		return StatusBadArgument
	}
	m.set(decodePairs(data))
	return StatusOK
}

func hGetHeaderSize(v *vm, p []uint64) Status {
	t := u32(p[0])
	if t > mapMax {
		return StatusBadArgument
	}
	m := v.writeMap(v.active(), t)
	if m == nil {
		return StatusBadArgument
	}
	if !v.mem.WriteUint32Le(u32(p[1]), uint32(m.byteSize())) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// Buffers.

// buffer returns the bytes of a buffer type and, for mutable ones, where to
// store changes. ok=false means Envoy has no such buffer now (NotFound).
func (v *vm) buffer(c *wctx, t uint32) (data []byte, slot *[]byte, ok bool) {
	switch t {
	case bufRequestBody:
		if c.reqBody == nil {
			return nil, nil, true // an empty buffer
		}
		return *c.reqBody, c.reqBody, true
	case bufResponseBody:
		if c.respBody == nil {
			return nil, nil, true
		}
		return *c.respBody, c.respBody, true
	case bufVMConfiguration:
		return []byte(v.h.cfg.VMConfiguration), nil, true
	case bufPluginConfig:
		root := c.rootCtx()
		if !root.configuring {
			return nil, nil, false
		}
		return []byte(v.h.cfg.Filters[root.filter].Configuration), nil, true
	case bufHTTPCallResponse:
		if r := c.rootCtx().callResp; r != nil {
			return r.body, nil, true
		}
		return nil, nil, false
	case bufDownstreamData, bufUpstreamData, bufGrpcReceive, bufCallData:
		return nil, nil, true
	}
	return nil, nil, false
}

func hGetBufferStatus(v *vm, p []uint64) Status {
	t := u32(p[0])
	if t > bufMax {
		return StatusBadArgument
	}
	data, _, ok := v.buffer(v.active(), t)
	if !ok {
		return StatusNotFound
	}
	if !v.mem.WriteUint32Le(u32(p[1]), uint32(len(data))) || !v.mem.WriteUint32Le(u32(p[2]), 0) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func hGetBufferBytes(v *vm, p []uint64) Status {
	t := u32(p[0])
	if t > bufMax {
		return StatusBadArgument
	}
	data, _, ok := v.buffer(v.active(), t)
	if !ok {
		return StatusNotFound
	}
	start, length := uint64(u32(p[1])), uint64(u32(p[2]))
	size := uint64(len(data))
	if start > size {
		length = 0
	} else if start+length > size {
		length = size - start
	}
	if length == 0 {
		if !v.mem.WriteUint32Le(u32(p[3]), 0) || !v.mem.WriteUint32Le(u32(p[4]), 0) {
			return StatusInvalidMemoryAccess
		}
		return StatusOK
	}
	return v.copyOut(data[start:start+length], u32(p[3]), u32(p[4]))
}

// hSetBufferBytes follows Envoy's Buffer::copyFrom: start 0 drains length
// bytes and prepends the data (so start 0, length = size replaces the
// body); start at or past the end appends; anything else is BadArgument, as
// are writes to read-only buffers.
func hSetBufferBytes(v *vm, p []uint64) Status {
	t := u32(p[0])
	if t > bufMax {
		return StatusBadArgument
	}
	c := v.active()
	data, slot, ok := v.buffer(c, t)
	if !ok {
		return StatusNotFound
	}
	in, ok := v.read(u32(p[3]), u32(p[4]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	if slot == nil {
		// Read-only buffers, and bodies when none is in flight (Envoy's
		// BufferBase::copyFrom).
		return StatusBadArgument
	}
	start, length := int(u32(p[1])), int(u32(p[2]))
	switch {
	case start == 0:
		if length > len(data) {
			length = len(data)
		}
		*slot = append(append([]byte{}, in...), data[length:]...)
	case start >= len(data):
		*slot = append(data, in...)
	default:
		return StatusBadArgument
	}
	return StatusOK
}

// HTTP callouts.

func hHTTPCall(v *vm, p []uint64) Status {
	upstream, ok1 := v.readString(u32(p[0]), u32(p[1]))
	hdrs, ok2 := v.read(u32(p[2]), u32(p[3]))
	body, ok3 := v.read(u32(p[4]), u32(p[5]))
	trl, ok4 := v.read(u32(p[6]), u32(p[7]))
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return StatusInvalidMemoryAccess
	}
	if !v.mem.WriteUint32Le(u32(p[9]), 0) {
		return StatusInvalidMemoryAccess
	}
	timeout := int32(u32(p[8]))
	if timeout < 0 {
		return StatusBadArgument
	}
	cl := v.h.clusters[upstream]
	if cl == nil {
		return StatusBadArgument
	}
	req := &headerMap{}
	req.set(decodePairs(hdrs))
	_, hasPath := req.get(":path")
	_, hasMethod := req.get(":method")
	_, hasAuthority := req.get(":authority")
	if !hasPath || !hasMethod || !hasAuthority {
		return StatusBadArgument
	}
	v.nextCallID++
	token := v.nextCallID
	root := v.active().rootCtx()
	go v.h.doHTTPCall(v, root, token, cl, req, body, decodePairs(trl), time.Duration(timeout)*time.Millisecond)
	if !v.mem.WriteUint32Le(u32(p[9]), token) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// gRPC is not emulated. Envoy answers a service that is neither a
// serialized GrpcService nor a known cluster with ParseFailure; this host
// has no gRPC clusters, so every call gets that answer.
func hGrpcOpen(_, _ int) hostFunc {
	return func(v *vm, p []uint64) Status {
		v.log(LevelWarn, v.active(), "wasmhost: gRPC calls are not emulated; answering ParseFailure as Envoy does for an unknown cluster")
		return StatusParseFailure
	}
}

// hGrpcToken answers close/cancel/send for tokens that cannot exist.
func hGrpcToken(v *vm, p []uint64) Status { return StatusBadArgument }

// Timers and time.

func hSetTickPeriod(v *vm, p []uint64) Status {
	root := v.active().rootCtx()
	v.setTick(root, time.Duration(u32(p[0]))*time.Millisecond)
	return StatusOK
}

func hGetCurrentTime(v *vm, p []uint64) Status {
	if !v.mem.WriteUint64Le(u32(p[0]), uint64(v.h.cfg.Clock().UnixNano())) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// Metrics, with Envoy's rules: counters only grow (increment by <= 0 is
// BadArgument), gauges go both ways, histograms only record, and
// get_metric of a histogram is BadArgument.

func hDefineMetric(v *vm, p []uint64) Status {
	t := u32(p[0])
	if t > metricHistogram {
		return StatusBadArgument
	}
	name, ok := v.readString(u32(p[1]), u32(p[2]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	m := v.h.metrics.define(name, MetricType(t))
	v.nextMetric[t]++
	id := v.nextMetric[t]<<2 | t
	v.metricIDs[id] = m
	if !v.mem.WriteUint32Le(u32(p[3]), id) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func hIncrementMetric(v *vm, p []uint64) Status {
	id, offset := u32(p[0]), int64(p[1])
	m := v.metricIDs[id]
	st := v.h.metrics
	switch id & metricTypeMask {
	case metricCounter:
		if m == nil {
			return StatusNotFound
		}
		if offset <= 0 {
			return StatusBadArgument
		}
	case metricGauge:
		if m == nil {
			return StatusNotFound
		}
	default:
		return StatusBadArgument
	}
	st.mu.Lock()
	m.Value += offset
	st.mu.Unlock()
	return StatusOK
}

func hRecordMetric(v *vm, p []uint64) Status {
	id, value := u32(p[0]), p[1]
	m := v.metricIDs[id]
	if m == nil {
		return StatusNotFound
	}
	st := v.h.metrics
	st.mu.Lock()
	defer st.mu.Unlock()
	switch id & metricTypeMask {
	case metricCounter:
		m.Value += int64(value)
	case metricGauge:
		m.Value = int64(value)
	case metricHistogram:
		m.Value++
		if len(m.Samples) < 1<<16 {
			m.Samples = append(m.Samples, value)
		}
	default:
		return StatusNotFound
	}
	return StatusOK
}

func hGetMetric(v *vm, p []uint64) Status {
	id := u32(p[0])
	t := id & metricTypeMask
	if t != metricCounter && t != metricGauge {
		return StatusBadArgument
	}
	m := v.metricIDs[id]
	if m == nil {
		return StatusNotFound
	}
	v.h.metrics.mu.Lock()
	val := m.Value
	v.h.metrics.mu.Unlock()
	if !v.mem.WriteUint64Le(u32(p[1]), uint64(val)) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// Contexts.

func hSetEffectiveContext(v *vm, p []uint64) Status {
	id := u32(p[0])
	if v.contexts[id] == nil {
		return StatusBadArgument
	}
	v.effective = id
	return StatusOK
}

// hDone answers proxy_done: only a root context whose on_done returned
// false during shutdown may call it; this host never shuts a VM down
// while it runs, so the answer is Envoy's NotFound.
func hDone(v *vm, p []uint64) Status { return StatusNotFound }

// Envoy's foreign functions (compress, declare_property, ...) are not
// emulated: every name is unknown, which Envoy answers with NotFound.
func hCallForeign(v *vm, p []uint64) Status {
	name, ok := v.readString(u32(p[0]), u32(p[1]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	v.log(LevelDebug, v.active(), "wasmhost: foreign function "+name+" is not emulated (NotFound)")
	return StatusNotFound
}

var _ = binary.LittleEndian
