package fleet

import (
	"time"

	"github.com/kvroute/kvroute/internal/sim/workload"
)

// RoundRobin sends request i to replica i mod N. It is the baseline every
// strategy is compared with, and needs nothing from the router packages.
type RoundRobin struct {
	N    int
	next int
}

// Route implements Router.
func (r *RoundRobin) Route(*workload.Request, string, time.Duration) int {
	k := r.next % r.N
	r.next++
	return k
}
