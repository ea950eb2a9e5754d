package wasmhosttest

import (
	"sync/atomic"
	"time"
)

// Clock is a wall clock a test moves itself, for wasmhost.Config.Clock.
// It stands still between calls to Advance, so what the module computes
// from the time (which recency bucket a record falls in, whether a pushed
// state is stale, whether an interval passed) is exact however slow the
// machine, and a test steps through seconds of the proxy's time at once.
// Safe for concurrent use: the host reads it from every worker.
type Clock struct{ nanos atomic.Int64 }

// NewClock returns a Clock reading start.
func NewClock(start time.Time) *Clock {
	c := &Clock{}
	c.nanos.Store(start.UnixNano())
	return c
}

// Now is the clock's reading; pass it as wasmhost.Config.Clock.
func (c *Clock) Now() time.Time { return time.Unix(0, c.nanos.Load()) }

// Advance moves the clock d forward and returns the new reading.
func (c *Clock) Advance(d time.Duration) time.Time { return time.Unix(0, c.nanos.Add(int64(d))) }
