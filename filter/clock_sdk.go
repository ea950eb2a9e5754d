//go:build !wasip1 || tinygo

package filter

import "time"

// monoStart anchors monoNanos outside the official Go Wasm build.
var monoStart = time.Now()

// monoNanos is the monotonic clock in nanoseconds, from an arbitrary start
// (see the Wasm build's version for why it is not time.Since there).
func monoNanos() int64 { return int64(time.Since(monoStart)) }

// wallMillis is the wall clock in milliseconds since the Unix epoch.
func wallMillis() int64 { return time.Now().UnixMilli() }
