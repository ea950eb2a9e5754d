// Package filter holds kvroute's Envoy-facing proxy-wasm filters.
package filter

import (
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// NewVMContext returns the VM context registered by the Wasm main package.
func NewVMContext(buildVariant string) types.VMContext {
	return &vmContext{buildVariant: buildVariant}
}

type vmContext struct {
	types.DefaultVMContext
	buildVariant string
}

func (v *vmContext) OnVMStart(int) types.OnVMStartStatus {
	proxywasm.LogInfof("kvroute: VM started (build %s)", v.buildVariant)
	return types.OnVMStartStatusOK
}

func (v *vmContext) NewPluginContext(contextID uint32) types.PluginContext {
	return &passThroughPlugin{}
}

// passThroughPlugin is a placeholder until the first filter lands: every
// stream continues untouched.
type passThroughPlugin struct{ types.DefaultPluginContext }

func (*passThroughPlugin) NewHttpContext(uint32) types.HttpContext { return &types.DefaultHttpContext{} }
