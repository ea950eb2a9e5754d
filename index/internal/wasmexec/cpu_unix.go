//go:build unix

package main

import "syscall"

// processCPU returns the CPU time this process has used, in nanoseconds,
// so that benchmarks inside the guest can report CPU time per op (the
// guest runs on this process's threads).
func processCPU() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
