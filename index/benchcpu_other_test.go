//go:build !linux

package index

import "time"

func cpuNow() time.Duration { return 0 }
