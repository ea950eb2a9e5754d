//go:build linux

package index

import (
	"syscall"
	"time"
)

// cpuNow returns the CPU time this process has used (all threads, user
// and system). Benchmarks report it per op next to wall time: on a shared
// machine wall time measures the neighbours as much as the code.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
