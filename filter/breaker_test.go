package filter

import (
	"testing"

	"github.com/kvroute/kvroute/config"
)

// anyOpen (the decision's shortcut past per-host lookups) follows every
// transition of every host's breaker.
func TestBreakerAnyOpenCountsOpenHosts(t *testing.T) {
	b := newBreakers(config.CircuitBreaker{ConsecutiveFailures: 2, CooldownMs: 100})
	check := func(step string, want bool, wantN int) {
		t.Helper()
		if b.anyOpen() != want || b.opened != wantN {
			t.Fatalf("%s: anyOpen %v (%d open), want %v (%d)", step, b.anyOpen(), b.opened, want, wantN)
		}
		// failing is the number of hosts not in the zero state.
		n := 0
		for _, st := range b.hosts {
			if *st != (breakerState{}) {
				n++
			}
		}
		if b.failing != n {
			t.Fatalf("%s: failing = %d, want %d", step, b.failing, n)
		}
	}
	check("start", false, 0)
	b.result("c", true, 0) // a success with nothing failing: no state kept
	if len(b.hosts) != 0 {
		t.Fatalf("a success created breaker state: %v", b.hosts)
	}
	b.result("a", false, 0)
	check("one failure", false, 0)
	b.result("c", false, 0)
	check("c failed once", false, 0)
	b.result("c", true, 0)
	check("c succeeded (reset)", false, 0)
	b.result("a", false, 0)
	check("a opened", true, 1)
	b.result("b", false, 0)
	b.result("b", false, 0)
	check("b opened", true, 2)
	b.result("a", false, 10) // another failure while open: still one host
	check("a failed again", true, 2)
	b.dispatched("a", 150) // half-open probe
	b.result("a", false, 160)
	check("a's probe failed (re-opened)", true, 2)
	b.dispatched("a", 300)
	b.result("a", true, 310)
	check("a's probe succeeded", true, 1)
	if !b.open("b", 50) || b.open("a", 50) {
		t.Fatal("open: want b only")
	}
	b.result("b", true, 400)
	check("b closed", false, 0)
	b.result("b", true, 410) // a success on a closed breaker
	check("b closed again", false, 0)
	if b.open("b", 50) {
		t.Fatal("b open with every breaker closed")
	}
}
