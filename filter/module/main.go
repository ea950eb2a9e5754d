// Command module is the Wasm main package of dist/kvroute.wasm (built by
// `make wasm`, see internal/wasmbuild). It carries both filters, told apart by
// the plugin's root id: kvroute.router and kvroute.pd.
//
// Root contexts are registered in init(): a c-shared (reactor) module runs
// package initialisation from _initialize, and main never runs.
package main

import (
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"

	"github.com/kvroute/kvroute/filter"
)

// buildVariant is set by internal/wasmbuild with -X: "standard" or
// "envoy-compat-1.NN". It is logged at VM start so a deployment can tell
// which build it runs.
var buildVariant = "dev"

func init() {
	proxywasm.SetVMContext(filter.NewVMContext(buildVariant))
}

func main() {}
