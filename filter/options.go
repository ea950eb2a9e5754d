package filter

import (
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// Options are what a test changes in how the filters run, given where
// they are built (NewVMContextWith): the Wasm module runs with the zero
// value. Each is per VM, like everything the plugins keep.
type Options struct {
	// Clock replaces the real clock for wall-clock readings and durations
	// (nil: the real clock), the index's included, so that a test steps
	// through breaker cool-downs, response latencies, state staleness,
	// slot grace periods and kvroute.pd's wait for a body.
	Clock func() time.Time
	// Emulated says the host is the SDK's proxytest emulator, which keeps
	// the slices and strings it is given where Envoy copies them: the
	// shared-data store then copies what it hands over, and the
	// destination header is handed over as a string of its own.
	Emulated bool
	// PDBodyWait is how long kvroute.pd waits, headers held, for a
	// request's body (0: pdBodyWait).
	PDBodyWait time.Duration

	// started, when set, receives every router plugin that starts, so
	// that the package's tests read its books.
	started func(*routerPlugin)
}

// clock is Clock, or the real clock when it is nil.
func (o Options) clock() func() time.Time {
	if o.Clock == nil {
		return time.Now
	}
	return o.Clock
}

// NewVMContextWith is NewVMContext with opts.
func NewVMContextWith(build string, opts Options) types.VMContext {
	return &vmContext{build: build, opts: opts}
}
