//go:build !linux && !(wasip1 && kvroute_hoststore)

package index

import "time"

func cpuNow() time.Duration { return 0 }
