package filter

import (
	"fmt"

	"github.com/kvroute/kvroute/filter/hostbuf"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// Test hook (only with "testHooks": true in the plugin configuration): the
// request header x-kvroute-test-panic makes the filter panic inside
// on_request_headers, so the Wasm integration tests can exercise both ways a
// panic ends:
//
//   - "recover": an ordinary panic; the guard recovers it, the request fails
//     open and kvroute.<filter>.recovered_panics counts it.
//   - "trap": a panic the guard deliberately lets through, so the VM traps the
//     way an unguarded bug would, and the host's fail-open/fail-closed handling
//     of a dead worker can be tested.
const testPanicHeader = "x-kvroute-test-panic"

// trapPanic is the panic value of the "trap" hook. guard re-panics it.
type trapPanic struct{}

func (trapPanic) String() string { return "kvroute test hook: trap requested" }

// testPanic acts on the test hook header, if the hook is enabled.
func testPanic(enabled bool, value string) {
	if enabled {
		hookPanic(value)
	}
}

// hookPanic is testPanic's enabled path, out of its callers' line
// (noinline): the panics box their values in place, code each request would
// enter in Wasm while the hook is off, as it is in production.
//
//go:noinline
func hookPanic(value string) {
	switch value {
	case "recover":
		panic("kvroute test hook: panic requested")
	case "trap":
		panic(trapPanic{})
	}
}

// guard recovers a panic at a callback boundary: it counts it, logs it
// (never request content: panic values come from kvroute's own code), runs
// failOpen, and sets *action to Continue so the stream proceeds. Use it as
//
//	defer guard(&stats.recoveredPanics, "on_request_headers", &action, s.failOpen)
//
// failOpen may be nil; a panic inside failOpen is swallowed too. The counter
// is passed by pointer: a metricCounter value would be boxed into the
// interface (a runtime call) at every callback, panic or not.
func guard(counter interface{ Increment(uint64) }, where string, action *types.Action, failOpen func()) {
	// recover works only when called by the deferred function itself; the
	// rest is out of line, as every callback enters guard and nearly none
	// has anything to recover.
	if r := recover(); r != nil {
		recovered(r, counter, where, action, failOpen)
	}
}

// recovered is guard's work once it has recovered r (noinline: inlined, it
// would be back in the code every callback enters).
//
//go:noinline
func recovered(r any, counter interface{ Increment(uint64) }, where string, action *types.Action, failOpen func()) {
	// A panic between a hostbuf.Lend and its withdrawal would leave the
	// buffer on offer, and the next host allocation could land in memory
	// the filter reuses.
	hostbuf.Lend(nil)
	if _, ok := r.(trapPanic); ok {
		panic(r)
	}
	if counter != nil {
		counter.Increment(1)
	}
	proxywasm.LogErrorf("kvroute: recovered panic in %s: %s (request fails open)", where, panicText(r))
	if action != nil {
		*action = types.ActionContinue
	}
	if failOpen != nil {
		func() {
			defer func() {
				if r2 := recover(); r2 != nil {
					if _, ok := r2.(trapPanic); ok {
						panic(r2)
					}
					proxywasm.LogErrorf("kvroute: panic while failing open in %s: %s", where, panicText(r2))
				}
			}()
			failOpen()
		}()
	}
}

// panicText renders a panic value for a log line, bounded in length.
func panicText(r any) string {
	s := fmt.Sprint(r)
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}
