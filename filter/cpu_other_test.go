//go:build !unix

package filter

import "time"

// processCPU is unavailable here; the CPU metrics read zero.
func processCPU() time.Duration { return 0 }
