package filter

import (
	"math"
	"time"
)

// mono is the time since the plugin started, from the monotonic clock
// alone: one host call per reading in Wasm (monoNanos), where time.Now
// makes two (wall and monotonic).
func (p *routerPlugin) mono() time.Duration {
	if p.stepped {
		return p.steppedMono()
	}
	return time.Duration(monoNanos() - p.bornMono)
}

// steppedMono is mono under a test clock. Out of line (noinline): inlined,
// the clock's call and Time.Sub would be code every reading enters in Wasm.
//
//go:noinline
func (p *routerPlugin) steppedMono() time.Duration { return p.now().Sub(p.born) }

// wallMs is the wall clock in Unix milliseconds (the index's, the pushed
// state's and the breakers' timestamps): one host call in Wasm
// (wallMillis), where time.Now makes two.
func (p *routerPlugin) wallMs() int64 {
	if p.stepped {
		return p.steppedWallMs()
	}
	return wallMillis()
}

// steppedWallMs is wallMs under a test clock, out of line for the reason
// of steppedMono.
//
//go:noinline
func (p *routerPlugin) steppedWallMs() int64 { return p.now().UnixMilli() }

// millis is d in milliseconds, truncated to whole microseconds: exactly
// float64(d/time.Microsecond)/1000 for any |d| below 2^53 ns (104 days),
// computed in floating point because Wasm has no multiply-high: Go divides
// an int64 by a constant with a multiply-high sequence spelled out in
// 32-bit halves, where the float division and truncation are one
// instruction each.
func millis(d time.Duration) float64 { return math.Trunc(float64(d)/1e3) / 1e3 }

// micros is d in whole microseconds, for the latency histograms.
func micros(d time.Duration) uint64 { return uint64(max(d, 0) / time.Microsecond) }
