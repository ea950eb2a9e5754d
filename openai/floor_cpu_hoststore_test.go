//go:build wasip1 && kvroute_hoststore

package openai

import "time"

// hostCPU is the CPU time of the process running the guest, from
// index/internal/wasmexec's kvroute_store module (build with -tags
// kvroute_hoststore to run under it).
//
//go:wasmimport kvroute_store cpu_ns
func hostCPU() int64

func cpuNow() time.Duration { return time.Duration(hostCPU()) }
