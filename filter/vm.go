// Package filter holds kvroute's Envoy-facing proxy-wasm filters.
//
// One Wasm module carries both filters; Envoy tells them apart by the plugin's
// root id, which the plugin context reads at start:
//
//   - kvroute.router decides which upstream serves each inference request and
//     says so in the destination header that Envoy's override_host policy
//     reads.
//   - kvroute.pd turns one request into prefill then decode (pd.go).
//
// A routed request's life in kvroute.router (the plugin: router.go):
//
//	request headers  strip client routing headers; state push, pass-through,
//	                 405, or hold the headers for the body (Pause) (request.go)
//	request body     validate and walk the JSON (openai/jsonvalid.go, jsonwalk.go),
//	                 hash the prompt into blocks (openai/parse.go), decide with
//	                 dispatch over the shared index, set the
//	                 destination header, resume (decide.go); or, when every
//	                 host is saturated, hold the stream for admission
//	                 (admission.go), released from on_tick by class and deadline
//	response headers status, latency and ORCA feed the breaker and the
//	                 host's load (response.go, with health's breakers and
//	                 ORCA parser)
//	response body    first byte ends pending prefill; cached_tokens is noted
//	                 (response.go, read by openai/usage.go)
//	stream done      feedback, then every load counter is released
//
// The candidates and their index slots: hosts.go; data-parallel ranks:
// dprank.go.
//
// Per worker VM: the candidate set, breakers and decision scratch. Shared by
// all workers through proxy-wasm shared data: the prefix index, the load
// counters and the pushed state (state.go, store.go).
//
// Every callback runs behind a panic guard (guard.go): inside Wasm a Go panic
// kills the VM for that worker, so a bug must cost one request, not a worker.
// The plugin configuration is parsed by config, which imports no SDK.
package filter

import (
	"errors"
	"fmt"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/scorer"
)

// Root ids of the two filters.
const (
	RootRouter = "kvroute.router"
	RootPD     = "kvroute.pd"
)

// NewVMContext returns the VM context the Wasm main package registers.
// build describes the module (version, revision, Go, Envoy variant); it is
// logged once per VM at start, so an operator can tell from Envoy's log
// which module each worker runs.
func NewVMContext(build string) types.VMContext {
	return &vmContext{build: build}
}

type vmContext struct {
	types.DefaultVMContext
	build string
	opts  Options
}

func (v *vmContext) OnVMStart(int) types.OnVMStartStatus {
	proxywasm.LogInfof("kvroute %s: VM started", v.build)
	return types.OnVMStartStatusOK
}

func (v *vmContext) NewPluginContext(contextID uint32) types.PluginContext {
	return &pluginContext{contextID: contextID, opts: v.opts}
}

// filterPlugin is what a root id turns into once its configuration is valid.
type filterPlugin interface {
	newStream(contextID uint32) types.HttpContext
	onTick()
}

// pluginContext is the root context. The SDK creates it before the host says
// which root id it serves, so it picks the filter in OnPluginStart.
type pluginContext struct {
	types.DefaultPluginContext
	contextID uint32
	opts      Options
	rootID    string
	plugin    filterPlugin
}

func (p *pluginContext) OnPluginStart(int) (status types.OnPluginStartStatus) {
	defer func() {
		if r := recover(); r != nil {
			proxywasm.LogCriticalf("kvroute: plugin start failed: panic: %s", panicText(r))
			status = types.OnPluginStartStatusFailed
		}
	}()
	rootID, err := proxywasm.GetProperty([]string{"plugin_root_id"})
	if err != nil {
		proxywasm.LogCriticalf("kvroute: cannot read property plugin_root_id (%v): set root_id to %q or %q", err, RootRouter, RootPD)
		return types.OnPluginStartStatusFailed
	}
	p.rootID = string(rootID)
	data, err := proxywasm.GetPluginConfiguration()
	if err != nil && !errors.Is(err, types.ErrorStatusNotFound) && !errors.Is(err, types.ErrorStatusEmpty) {
		proxywasm.LogCriticalf("%s: cannot read the plugin configuration: %v", p.rootID, err)
		return types.OnPluginStartStatusFailed
	}
	cfg, handler, warnings, err := scorer.Load(data)
	if err != nil {
		proxywasm.LogCriticalf("%s: invalid plugin configuration: %v", p.rootID, err)
		return types.OnPluginStartStatusFailed
	}
	switch p.rootID {
	case RootRouter:
		p.plugin, err = newRouter(cfg, handler, warnings, p.opts)
	case RootPD:
		p.plugin, err = newPD(cfg, p.opts)
	default:
		err = fmt.Errorf("unknown root id %q: set the plugin's root_id to %q or %q", p.rootID, RootRouter, RootPD)
	}
	if err != nil {
		proxywasm.LogCriticalf("kvroute: %v", err)
		return types.OnPluginStartStatusFailed
	}
	proxywasm.LogInfof("%s: started with %d static endpoints, strategy %s", p.rootID, len(cfg.Endpoints), cfg.Strategy)
	return types.OnPluginStartStatusOK
}

func (p *pluginContext) NewHttpContext(contextID uint32) types.HttpContext {
	if p.plugin == nil {
		// Envoy creates no streams for a plugin that failed to start; a host
		// that does gets a pass-through rather than a trap.
		return &types.DefaultHttpContext{}
	}
	return p.plugin.newStream(contextID)
}

func (p *pluginContext) OnTick() {
	defer func() {
		if r := recover(); r != nil {
			proxywasm.LogErrorf("%s: recovered panic in on_tick: %s", p.rootID, panicText(r))
		}
	}()
	if p.plugin != nil {
		p.plugin.onTick()
	}
}
