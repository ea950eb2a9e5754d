//go:build wasip1 && !tinygo

package filter

import "fmt"

// wasiClockTimeGet is WASI's clock, which the Go runtime reads behind
// time.Now (twice: wall and monotonic) and time.Since. Imported here so
// that a routed request reads each clock it needs once, without entering
// the time package's and the runtime's wrappers (six functions).
//
//go:wasmimport wasi_snapshot_preview1 clock_time_get
func wasiClockTimeGet(clockID uint32, precision uint64, time *uint64) uint32

// WASI's clock ids.
const (
	clockRealtime  = 0
	clockMonotonic = 1
)

// clockReading receives a reading; package-level for the reason
// headerMapPtr is.
var clockReading uint64

// readClock returns clock id's reading in nanoseconds, asked for at the
// precision the Go runtime asks for (0: the best the host has).
func readClock(id uint32) int64 {
	if errno := wasiClockTimeGet(id, 0, &clockReading); errno != 0 {
		clockFailed(errno)
	}
	return int64(clockReading)
}

// clockFailed panics, where the Go runtime would throw, when the host
// cannot read a clock; the callback's guard recovers it. Out of line
// (hence noinline): it never runs.
//
//go:noinline
func clockFailed(errno uint32) {
	panic(fmt.Sprintf("clock_time_get failed: errno %d", errno))
}

// monoNanos is the monotonic clock in nanoseconds, from an arbitrary start.
func monoNanos() int64 { return readClock(clockMonotonic) }

// wallMillis is the wall clock in milliseconds since the Unix epoch, as
// time.Now().UnixMilli().
func wallMillis() int64 { return readClock(clockRealtime) / 1e6 }
