package filter

import (
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// TestMillisIsWholeMicroseconds checks the response latency's float
// arithmetic against the integer division it replaces.
func TestMillisIsWholeMicroseconds(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	check := func(d time.Duration) {
		if got, want := millis(d), float64(d/time.Microsecond)/1000; got != want {
			t.Fatalf("millis(%d) = %v, want %v", d, got, want)
		}
	}
	for _, d := range []time.Duration{0, 1, 999, 1000, 1001, 1999, 2000, 1<<53 - 1, -1, -999, -1000, -1001, -(1<<53 - 1)} {
		check(d)
	}
	for i := 0; i < 1_000_000; i++ {
		d := time.Duration(rng.Int63n(1 << uint(1+rng.Intn(53))))
		if i%2 == 1 {
			d = -d
		}
		check(d)
	}
}

// TestResponsesTimedOnlyWhenRead checks that the response path measures the
// time to first byte exactly when something reads it: the latency scorer
// (through the hosts' EWMA) or the breaker's latency threshold.
func TestResponsesTimedOnlyWhenRead(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	for _, c := range []struct {
		name, cfg string
		timed     bool
	}{
		{"default", `}`, false},
		{"latency threshold", `,"circuitBreaker":{"latencyThresholdMs":2000}}`, true},
		{"latency scorer", `,"strategy":"fast","profiles":{"fast":{"scorers":[{"plugin":"latency"}],"picker":"max_score"}}}`, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			host, p := newHostWith(t, Options{Clock: func() time.Time { return now }}, RootRouter, threeEndpoints+c.cfg, types.OnPluginStartStatusOK)
			if p.timeResponses != c.timed {
				t.Fatalf("timeResponses = %v, want %v", p.timeResponses, c.timed)
			}
			id, _ := post(host, completion)
			primary := strings.Split(destination(host, id), ",")[0]
			now = now.Add(40 * time.Millisecond)
			host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
			host.CompleteHttpContext(id)
			want := 0.0
			if c.timed {
				want = 40
			}
			if got := p.hosts[p.pos[primary]].LatencyEWMAMs; got != want {
				t.Errorf("latency EWMA of %s = %v ms, want %v", primary, got, want)
			}
		})
	}
}
