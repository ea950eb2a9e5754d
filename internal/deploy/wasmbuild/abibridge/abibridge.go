// Package abibridge carries the ABI bridge that lets the official Go toolchain
// build proxy-wasm modules from code written against
// github.com/tetratelabs/proxy-wasm-go-sdk v0.24.0.
//
// That SDK targets TinyGo: its host calls and callbacks are marked with
// TinyGo's //export, which the gc compiler ignores, so a plain
// `GOOS=wasip1 go build` succeeds and exports nothing. The bridge is two Go
// source files written for kvroute, kept here as .go.in so that the native
// build never compiles them (they belong to the SDK's internal package and use
// //go:wasmimport):
//
//   - hostcalls.go.in replaces the SDK's proxytest-only abi_hostcalls_mock.go
//     with //go:wasmimport declarations of the env.proxy_* host functions, and
//     owns proxy_on_memory_allocate with a pinned arena (buffers the host asks
//     for stay reachable until the host call returns); a buffer the filter
//     lent through filter/hostbuf is used instead of a fresh allocation.
//   - callbacks.go.in adds //go:wasmexport wrappers for every proxy_on_*
//     callback and proxy_abi_version_0_2_1. HTTP streams are dispatched
//     from a table of the bridge's own instead of the SDK's maps, whose
//     code every request would otherwise run.
//
// internal/deploy/wasmbuild copies the SDK from the module cache, unmodified, into
// .wasmbuild/ (Go refuses overlays inside GOMODCACHE) and injects these files
// with `go build -overlay`. Nothing here is imported by the filter code.
package abibridge

import _ "embed"

// File is one bridge source and where it goes in the SDK's
// proxywasm/internal directory.
type File struct {
	// Name is the file name inside proxywasm/internal. When the SDK has a file
	// of that name, the overlay replaces it; otherwise it adds one.
	Name   string
	Source []byte
}

//go:embed hostcalls.go.in
var hostcalls []byte

//go:embed callbacks.go.in
var callbacks []byte

// SDKVersion is the SDK release the bridge was written against. The signatures
// in hostcalls.go.in must match that release's internal package exactly.
const SDKVersion = "v0.24.0"

// SDKModule is the module path of the SDK the bridge plugs into.
const SDKModule = "github.com/tetratelabs/proxy-wasm-go-sdk"

// Files returns the bridge sources in overlay order.
func Files() []File {
	return []File{
		{Name: "abi_hostcalls_mock.go", Source: hostcalls},
		{Name: "kvroute_wasmexport.go", Source: callbacks},
	}
}
