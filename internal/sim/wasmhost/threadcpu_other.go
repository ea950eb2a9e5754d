//go:build !linux

package wasmhost

import "time"

// threadCPU is not measured here: CallStat.CPU stays zero.
func threadCPU() time.Duration { return 0 }
