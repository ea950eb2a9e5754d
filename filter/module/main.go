// Command module is the Wasm main package of dist/kvroute.wasm (built by
// `make wasm`, see internal/deploy/wasmbuild). It carries both filters, told apart by
// the plugin's root id: kvroute.router and kvroute.pd.
//
// Root contexts are registered in init(): a c-shared (reactor) module runs
// package initialisation from _initialize, and main never runs.
package main

import (
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"

	"github.com/kvroute/kvroute/filter"
)

// build is set by internal/deploy/wasmbuild with -X to the module's version line,
// e.g. "v0.1.0 (revision 0123456789ab, go1.26.8), envoy-compat build, for
// Envoy 1.33 to 1.38". It is logged once per VM at start; `kvroute version
// FILE.wasm` reads the same facts from the module's kvroute.buildinfo section.
var build = "(version unknown: not built by make wasm)"

func init() {
	proxywasm.SetVMContext(filter.NewVMContext(build))
}

func main() {}
