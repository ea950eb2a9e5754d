package wasmhost

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU is the CPU time the calling OS thread has used. A callback's
// CPU time (CallStat.CPU) is read with it around the call, with the
// goroutine locked to its thread: unlike wall time it does not grow when
// other processes take the machine's cores.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
