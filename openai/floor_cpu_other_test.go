//go:build !(wasip1 && kvroute_hoststore)

package openai

import "time"

// cpuNow is 0 where the guest cannot read CPU time: BenchmarkShapeFloors
// then compares wall times.
func cpuNow() time.Duration { return 0 }
