package health

import (
	"testing"

	"github.com/kvroute/kvroute/config"
)

// AnyOpen (the decision's shortcut past per-host lookups) follows every
// transition of every host's breaker.
func TestBreakerAnyOpenCountsOpenHosts(t *testing.T) {
	b := NewBreakers(config.CircuitBreaker{ConsecutiveFailures: 2, CooldownMs: 100})
	check := func(step string, want bool, wantN int) {
		t.Helper()
		if b.AnyOpen() != want || b.opened != wantN {
			t.Fatalf("%s: AnyOpen %v (%d open), want %v (%d)", step, b.AnyOpen(), b.opened, want, wantN)
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
	b.Result("c", true, 0) // a success with nothing failing: no state kept
	if len(b.hosts) != 0 {
		t.Fatalf("a success created breaker state: %v", b.hosts)
	}
	b.Result("a", false, 0)
	check("one failure", false, 0)
	b.Result("c", false, 0)
	check("c failed once", false, 0)
	b.Result("c", true, 0)
	check("c succeeded (reset)", false, 0)
	b.Result("a", false, 0)
	check("a opened", true, 1)
	b.Result("b", false, 0)
	b.Result("b", false, 0)
	check("b opened", true, 2)
	b.Result("a", false, 10) // another failure while open: still one host
	check("a failed again", true, 2)
	b.Dispatched("a", 150) // half-open probe
	b.Result("a", false, 160)
	check("a's probe failed (re-opened)", true, 2)
	b.Dispatched("a", 300)
	b.Result("a", true, 310)
	check("a's probe succeeded", true, 1)
	if !b.Open("b", 50) || b.Open("a", 50) {
		t.Fatal("open: want b only")
	}
	b.Result("b", true, 400)
	check("b closed", false, 0)
	b.Result("b", true, 410) // a success on a closed breaker
	check("b closed again", false, 0)
	if b.Open("b", 50) {
		t.Fatal("b open with every breaker closed")
	}
}

func TestBreakerUnit(t *testing.T) {
	b := NewBreakers(config.CircuitBreaker{ConsecutiveFailures: 3, CooldownMs: 100})
	for i := 0; i < 2; i++ {
		b.Result("a", false, 0)
	}
	b.Result("a", true, 0) // a success resets the count
	for i := 0; i < 2; i++ {
		if b.Result("a", false, 0) {
			t.Fatal("opened before 3 consecutive failures")
		}
	}
	if !b.Result("a", false, 10) || !b.Open("a", 50) {
		t.Fatal("3 consecutive failures must open")
	}
	if b.Open("a", 110) { // cool-down over: half-open, one probe allowed
		t.Fatal("no probe after the cool-down")
	}
	b.Dispatched("a", 110)
	if !b.Open("a", 111) {
		t.Fatal("a second request while the probe is in flight")
	}
	b.Abandoned("a") // the probe's client went away
	if b.Open("a", 112) {
		t.Fatal("an abandoned probe must let the next request probe")
	}
	b.Dispatched("a", 112)
	b.Result("a", true, 120)
	if b.Open("a", 121) {
		t.Fatal("a successful probe must close the breaker")
	}
}
