// Command gcprobe is the kvroute module plus two things the compat test
// needs: an armed timer (which starts the Go runtime's netpoller, as a
// sleeping background goroutine eventually does in a long-running filter) and
// an export that runs the GC on demand. Built only by wasmbuild's tests.
package main

import (
	"runtime"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"

	"github.com/kvroute/kvroute/filter"
)

var timer *time.Timer

func init() {
	proxywasm.SetVMContext(filter.NewVMContext("gcprobe"))
	timer = time.AfterFunc(time.Hour, func() {})
}

//go:wasmexport kvroute_probe_gc
func probeGC() { runtime.GC() }

func main() {}
