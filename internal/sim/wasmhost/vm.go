package wasmhost

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"
)

// vm is one instance of the module: Envoy's per-worker Wasm VM. Every call
// into it holds mu, so a VM runs one callback at a time, as on an Envoy
// worker thread.
type vm struct {
	h     *Host
	index int
	mod   api.Module
	mem   api.Memory
	ctx   context.Context

	mu      sync.Mutex
	failed  atomic.Bool
	streams atomic.Int64 // streams assigned to this VM

	fn struct {
		malloc, onContextCreate, onVMStart, onConfigure       api.Function
		onRequestHeaders, onRequestBody, onRequestTrailers    api.Function
		onResponseHeaders, onResponseBody, onResponseTrailers api.Function
		onHTTPCallResponse, onTick, onQueueReady              api.Function
		onLog, onDone, onDelete                               api.Function
	}

	nextContextID uint32
	contexts      map[uint32]*wctx
	roots         []*wctx // one per Config.Filters entry
	metricIDs     map[uint32]*Metric
	nextMetric    [3]uint32
	nextCallID    uint32

	// State of the call in progress (guarded by mu).
	current    *wctx
	effective  uint32
	stopNext   bool
	after      []func()
	restricted bool
	allocating bool
}

type vmKey struct{}

func vmFrom(ctx context.Context) *vm { return ctx.Value(vmKey{}).(*vm) }

// wctx is a proxy-wasm context: a root context (one per plugin per VM) or an
// HTTP context (one per plugin per stream).
type wctx struct {
	id     uint32
	vm     *vm
	filter int
	root   *wctx // nil for a root context

	// Root context.
	configuring bool // plugin configuration readable (on_context_create, on_configure)
	tick        *time.Ticker
	tickStop    chan struct{}
	tickPeriod  time.Duration
	callResp    *callResponse // set during on_http_call_response
	status      uint32
	statusMsg   string

	// HTTP context.
	s                *stream
	created          bool
	reqHeaders       *headerMap // nil once the request headers continued
	respHeaders      *headerMap // nil once the response headers continued
	reqBody          *[]byte    // body buffer exposed during on_request_body
	respBody         *[]byte
	accessLog        bool
	failureReplySent bool
	props            map[string][]byte
}

func (c *wctx) rootCtx() *wctx {
	if c.root == nil {
		return c
	}
	return c.root
}

// vmTrap is how a host function makes the module trap.
type vmTrap struct{ msg string }

func (t vmTrap) Error() string { return t.msg }

func (v *vm) newContext(filter int, root *wctx) *wctx {
	v.nextContextID++
	c := &wctx{id: v.nextContextID, vm: v, filter: filter, root: root}
	v.contexts[c.id] = c
	return c
}

func (v *vm) rootID(c *wctx) string {
	if c == nil || c.filter < 0 || c.filter >= len(v.h.cfg.Filters) {
		return ""
	}
	return v.h.cfg.Filters[c.filter].RootID
}

func (v *vm) log(level int, c *wctx, msg string) {
	v.h.logs.add(LogEntry{Level: level, Worker: v.index, RootID: v.rootID(c), Message: msg})
}

// fail marks the VM failed, as Envoy does on a runtime error: every later
// callback on this VM is skipped and streams follow the fail-open setting.
func (v *vm) fail(what string, err error) {
	if v.failed.Swap(true) {
		return
	}
	msg := fmt.Sprintf("wasmhost: VM %d failed: Function: %s failed: %v", v.index, what, err)
	v.log(LevelCritical, v.current, msg)
	v.h.vmFailures.Add(1)
}

// call runs one callback with c as the current context and returns its
// result, whether send_local_response asked to stop the iteration, and
// whether the call completed. Actions the module deferred (continue_stream,
// send_local_response, ...) run after the VM lock is released, like Envoy's
// after-VM-call actions.
func (v *vm) call(c *wctx, name string, fn api.Function, args ...uint64) (res uint64, stop bool, ok bool) {
	if fn == nil {
		return 0, false, true
	}
	v.mu.Lock()
	if v.failed.Load() {
		v.mu.Unlock()
		return 0, false, false
	}
	v.current, v.effective, v.stopNext, v.after = c, 0, false, nil
	// Locked to its thread for the call, so that the thread's CPU clock
	// measures the callback alone.
	runtime.LockOSThread()
	t0, cpu0 := time.Now(), threadCPU()
	out, err := fn.Call(v.ctx, args...)
	v.h.calls.get(name, "callback").addCPU(time.Since(t0), threadCPU()-cpu0)
	runtime.UnlockOSThread()
	stop = v.stopNext
	after := v.after
	v.current, v.effective, v.stopNext, v.after = nil, 0, false, nil
	if err != nil {
		v.fail(name, err)
		v.mu.Unlock()
		return 0, stop, false
	}
	v.mu.Unlock()
	for _, f := range after {
		f()
	}
	if len(out) > 0 {
		res = out[0]
	}
	return res, stop, true
}

// active is contextOrEffectiveContext: the context set by
// proxy_set_effective_context if it still exists, else the current one.
func (v *vm) active() *wctx {
	if v.effective != 0 {
		if c := v.contexts[v.effective]; c != nil {
			return c
		}
	}
	return v.current
}

func (v *vm) defer_(f func()) { v.after = append(v.after, f) }

// Memory helpers. Reads copy, so values survive the module's later writes.

func (v *vm) read(ptr, size uint32) ([]byte, bool) {
	if size == 0 {
		return []byte{}, true
	}
	b, ok := v.mem.Read(ptr, size)
	if !ok {
		return nil, false
	}
	return bytes.Clone(b), true
}

func (v *vm) readString(ptr, size uint32) (string, bool) {
	if size == 0 {
		return "", true
	}
	b, ok := v.mem.Read(ptr, size)
	if !ok {
		return "", false
	}
	return string(b), true
}

// copyOut is copyToPointerSize: it allocates len(data) bytes in the module
// with proxy_on_memory_allocate (nothing for empty data), copies data there
// and writes the pointer and size.
func (v *vm) copyOut(data []byte, ptrPtr, sizePtr uint32) Status {
	var ptr uint32
	if len(data) > 0 {
		p, ok := v.alloc(uint32(len(data)))
		if !ok || !v.mem.Write(p, data) {
			return StatusInvalidMemoryAccess
		}
		ptr = p
	}
	if !v.mem.WriteUint32Le(ptrPtr, ptr) || !v.mem.WriteUint32Le(sizePtr, uint32(len(data))) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func (v *vm) alloc(size uint32) (uint32, bool) {
	t0 := time.Now()
	out, err := v.fn.malloc.Call(v.ctx, uint64(size))
	v.h.calls.get("proxy_on_memory_allocate", "memory").add(time.Since(t0))
	if err != nil || len(out) == 0 || out[0] == 0 {
		return 0, false
	}
	return uint32(out[0]), true
}

// Module instantiation.

// callbackSigs are the signatures proxy-wasm-cpp-host expects of the
// callbacks it looks up (all i32); a module exporting one with another
// signature fails to load, as in Envoy. Missing callbacks are allowed.
var callbackSigs = map[string]struct{ params, results int }{
	"proxy_on_memory_allocate":    {1, 1},
	"proxy_on_context_create":     {2, 0},
	"proxy_on_vm_start":           {2, 1},
	"proxy_on_configure":          {2, 1},
	"proxy_on_request_headers":    {3, 1},
	"proxy_on_request_body":       {3, 1},
	"proxy_on_request_trailers":   {2, 1},
	"proxy_on_response_headers":   {3, 1},
	"proxy_on_response_body":      {3, 1},
	"proxy_on_response_trailers":  {2, 1},
	"proxy_on_http_call_response": {5, 0},
	"proxy_on_tick":               {1, 0},
	"proxy_on_queue_ready":        {2, 0},
	"proxy_on_log":                {1, 0},
	"proxy_on_done":               {1, 1},
	"proxy_on_delete":             {1, 0},
}

// checkModule fails the way Envoy fails to load a module: no proxy-wasm ABI
// version export, or a callback with the wrong signature.
func checkModule(cm wazero.CompiledModule) error {
	exports := cm.ExportedFunctions()
	abi := ""
	for _, name := range []string{"proxy_abi_version_0_2_1", "proxy_abi_version_0_2_0"} {
		if _, ok := exports[name]; ok {
			abi = name
			break
		}
	}
	if abi == "" {
		return errors.New("wasmhost: Missing or unknown Proxy-Wasm ABI version: the module exports neither proxy_abi_version_0_2_1 nor proxy_abi_version_0_2_0 (check the ABI bridge and -buildmode=c-shared)")
	}
	if _, ok := exports["proxy_on_memory_allocate"]; !ok {
		if _, ok := exports["malloc"]; !ok {
			return errors.New("wasmhost: Wasm module is missing malloc function (export proxy_on_memory_allocate)")
		}
	}
	if _, ok := exports["_initialize"]; !ok {
		if _, ok := exports["_start"]; !ok {
			return errors.New("wasmhost: the module exports neither _initialize (a WASI reactor, -buildmode=c-shared) nor _start")
		}
	}
	var bad []string
	for name, sig := range callbackSigs {
		f, ok := exports[name]
		if !ok {
			continue
		}
		p, r := f.ParamTypes(), f.ResultTypes()
		good := len(p) == sig.params && len(r) == sig.results
		for _, t := range append(append([]api.ValueType{}, p...), r...) {
			good = good && t == api.ValueTypeI32
		}
		if !good {
			bad = append(bad, fmt.Sprintf("%s%v%v", name, p, r))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("wasmhost: Bad function signature for: %s (proxy-wasm callbacks take and return i32 only)", strings.Join(bad, ", "))
	}
	return nil
}

// walltime is WASI's realtime clock: Config.Clock, in the form wazero
// asks for it.
func (h *Host) walltime() (sec int64, nsec int32) {
	t := h.cfg.Clock()
	return t.Unix(), int32(t.Nanosecond())
}

func (h *Host) startVM(ctx context.Context, index int) (*vm, error) {
	v := &vm{h: h, index: index, contexts: map[uint32]*wctx{}, metricIDs: map[uint32]*Metric{}}
	v.ctx = context.WithValue(context.Background(), vmKey{}, v)
	mc := wazero.NewModuleConfig().
		WithName(fmt.Sprintf("vm-%d", index)).
		WithStartFunctions(). // _initialize is called below, restricted like Envoy's startVm
		WithWalltime(h.walltime, sys.ClockResolution(time.Microsecond)).WithSysNanotime().WithRandSource(crand.Reader).
		WithStdout(&lineLogger{v: v, level: LevelInfo}).
		WithStderr(&lineLogger{v: v, level: LevelError})
	keys := make([]string, 0, len(h.cfg.Env))
	for k := range h.cfg.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		mc = mc.WithEnv(k, h.cfg.Env[k])
	}
	mod, err := h.runtime.InstantiateModule(v.ctx, h.compiled, mc)
	if err != nil {
		return nil, fmt.Errorf("wasmhost: Failed to load Wasm module (worker %d): %w", index, err)
	}
	v.mod, v.mem = mod, mod.Memory()
	get := func(name string) api.Function { return mod.ExportedFunction(name) }
	v.fn.malloc = get("proxy_on_memory_allocate")
	if v.fn.malloc == nil {
		v.fn.malloc = get("malloc")
	}
	v.fn.onContextCreate = get("proxy_on_context_create")
	v.fn.onVMStart = get("proxy_on_vm_start")
	v.fn.onConfigure = get("proxy_on_configure")
	v.fn.onRequestHeaders = get("proxy_on_request_headers")
	v.fn.onRequestBody = get("proxy_on_request_body")
	v.fn.onRequestTrailers = get("proxy_on_request_trailers")
	v.fn.onResponseHeaders = get("proxy_on_response_headers")
	v.fn.onResponseBody = get("proxy_on_response_body")
	v.fn.onResponseTrailers = get("proxy_on_response_trailers")
	v.fn.onHTTPCallResponse = get("proxy_on_http_call_response")
	v.fn.onTick = get("proxy_on_tick")
	v.fn.onQueueReady = get("proxy_on_queue_ready")
	v.fn.onLog = get("proxy_on_log")
	v.fn.onDone = get("proxy_on_done")
	v.fn.onDelete = get("proxy_on_delete")

	// WASI reactor start: only logging and a few WASI calls are allowed
	// while _initialize runs (proxy-wasm-cpp-host's restricted callback).
	v.mu.Lock()
	v.restricted = true
	var initErr error
	if f := get("_initialize"); f != nil {
		_, initErr = f.Call(v.ctx)
		if initErr == nil {
			if m := get("main"); m != nil {
				_, initErr = m.Call(v.ctx, 0, 0)
			}
		}
	} else if f := get("_start"); f != nil {
		_, initErr = f.Call(v.ctx)
	}
	v.restricted = false
	v.mu.Unlock()
	if initErr != nil {
		v.fail("_initialize", initErr)
		return nil, fmt.Errorf("wasmhost: Failed to initialize Wasm code (worker %d): %w", index, initErr)
	}

	// One root context per plugin: on_context_create(root, 0) and
	// on_vm_start with the VM configuration size, then on_configure with
	// the plugin configuration size. The plugin configuration is readable
	// during these calls only.
	for i := range h.cfg.Filters {
		f := &h.cfg.Filters[i]
		root := v.newContext(i, nil)
		v.roots = append(v.roots, root)
		root.configuring = true
		if _, _, ok := v.call(root, "proxy_on_context_create", v.fn.onContextCreate, uint64(root.id), 0); !ok {
			return nil, v.startError(f, "proxy_on_context_create trapped")
		}
		// on_vm_start sees the VM configuration only: Envoy unsets the
		// plugin for it, since which plugin starts the VM is arbitrary.
		root.configuring = false
		res, _, ok := v.call(root, "proxy_on_vm_start", v.fn.onVMStart, uint64(root.id), uint64(len(h.cfg.VMConfiguration)))
		if !ok || (v.fn.onVMStart != nil && uint32(res) == 0) {
			return nil, v.startError(f, "Failed to start base Wasm: proxy_on_vm_start returned false")
		}
		root.configuring = true
		res, _, ok = v.call(root, "proxy_on_configure", v.fn.onConfigure, uint64(root.id), uint64(len(f.Configuration)))
		root.configuring = false
		if !ok || (v.fn.onConfigure != nil && uint32(res) == 0) {
			return nil, v.startError(f, "Failed to configure base Wasm plugin: proxy_on_configure returned false")
		}
	}
	return v, nil
}

// startError is the error New returns when a plugin fails to start; it
// carries the module's own warn/error lines so the user sees which field of
// the configuration is wrong.
func (v *vm) startError(f *Filter, what string) error {
	var lines []string
	for _, e := range v.h.logs.snapshot() {
		if e.Worker == v.index && e.Level >= LevelWarn && !strings.HasPrefix(e.Message, "wasmhost:") {
			lines = append(lines, e.Message)
		}
	}
	if v.failed.Load() {
		for _, e := range v.h.logs.matching("wasmhost: VM ") {
			if e.Worker == v.index {
				lines = append(lines, e.Message)
			}
		}
	}
	msg := fmt.Sprintf("wasmhost: plugin %q (root id %q) failed to start on worker %d: %s", f.name(), f.RootID, v.index, what)
	if len(lines) > 0 {
		msg += "; module log: " + strings.Join(lines, " | ")
	} else {
		msg += "; the module logged nothing at warn or above"
	}
	v.h.logs.add(LogEntry{Level: LevelCritical, Worker: v.index, RootID: f.RootID, Message: msg})
	return &PluginStartError{RootID: f.RootID, Worker: v.index, Msg: msg, ModuleLog: lines}
}

// PluginStartError is returned by New when proxy_on_vm_start or
// proxy_on_configure returns false (or traps) for a plugin: Envoy rejects
// such a configuration. ModuleLog holds what the module logged at warn or
// above while starting, which is where a filter names the bad field.
type PluginStartError struct {
	RootID    string
	Worker    int
	Msg       string
	ModuleLog []string
}

func (e *PluginStartError) Error() string { return e.Msg }

// lineLogger turns the module's stdout/stderr writes into log lines (info
// and error), as Envoy does.
type lineLogger struct {
	v     *vm
	level int
	buf   []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.v.log(l.level, l.v.current, string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
	if len(l.buf) > 4096 {
		l.v.log(l.level, l.v.current, string(l.buf))
		l.buf = l.buf[:0]
	}
	return len(p), nil
}

// Ticks: one timer per root context per VM, firing on_tick on that VM,
// on real time whatever Config.Clock says (see there for why).

func (v *vm) setTick(root *wctx, period time.Duration) {
	if root.tickStop != nil {
		close(root.tickStop)
		root.tickStop = nil
	}
	root.tickPeriod = period
	if period <= 0 {
		return
	}
	stop := make(chan struct{})
	root.tickStop = stop
	go func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-v.h.done:
				return
			case <-t.C:
				v.call(root, "proxy_on_tick", v.fn.onTick, uint64(root.id))
			}
		}
	}()
}
