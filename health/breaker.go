package health

import "github.com/kvroute/kvroute/config"

// Breakers is per-host circuit breaking, per worker VM: consecutive failures
// (5xx, connect failures seen as a fallback taking over, or responses slower
// than the latency threshold) open a host's breaker; after the cool-down one
// probe request is let through (half-open); its success closes the breaker,
// its failure re-opens it for another cool-down.
//
// Its scope is one Envoy worker (the filter keeps one per plugin), not
// shared data: each worker learns from its own traffic, which is enough to
// stop sending to a dead pod within a few requests, and costs no
// shared-data writes on the request path. A request that lands on another
// worker meets that worker's breakers. Hosts are keyed by address; a
// departed pod's entry is the zero state again after its last success, and
// only failing or open hosts hold one.
type Breakers struct {
	cfg   config.CircuitBreaker
	hosts map[string]*breakerState
	// opened counts the hosts whose openUntil is set (open or half-open):
	// while it is 0, which is nearly always, a decision skips the per-host
	// lookups (AnyOpen).
	opened int
	// failing counts the hosts whose state is not the zero state (a
	// failure counted, or open): while it is 0, a success changes nothing
	// and Result skips the lookup.
	failing int
}

type breakerState struct {
	failures  int
	openUntil int64 // ms; 0 when closed
	probing   bool  // a half-open probe is in flight
}

// NewBreakers returns breakers that open after cfg.ConsecutiveFailures and
// stay open for cfg.CooldownMs; with no failure count they never open.
func NewBreakers(cfg config.CircuitBreaker) *Breakers {
	return &Breakers{cfg: cfg, hosts: map[string]*breakerState{}}
}

func (b *Breakers) state(addr string) *breakerState {
	st := b.hosts[addr]
	if st == nil {
		st = &breakerState{}
		b.hosts[addr] = st
	}
	return st
}

// AnyOpen reports whether some host's breaker is open or half-open; when
// it is not, Open is false for every address.
func (b *Breakers) AnyOpen() bool { return b.opened > 0 }

// Failing reports whether some host has a failure counted or is open: while
// none has, a success changes nothing and need not be recorded.
func (b *Breakers) Failing() bool { return b.failing > 0 }

// setOpenUntil sets st.openUntil, keeping b.opened.
func (b *Breakers) setOpenUntil(st *breakerState, until int64) {
	switch {
	case st.openUntil == 0 && until != 0:
		b.opened++
	case st.openUntil != 0 && until == 0:
		b.opened--
	}
	st.openUntil = until
}

// Open reports whether addr must not be picked now.
func (b *Breakers) Open(addr string, nowMs int64) bool {
	if b.opened == 0 {
		return false
	}
	st := b.hosts[addr]
	if st == nil || st.openUntil == 0 {
		return false
	}
	if nowMs < st.openUntil {
		return true
	}
	return st.probing // half-open: one probe at a time
}

// Dispatched notes that a request went to addr; past the cool-down it is
// the half-open probe.
func (b *Breakers) Dispatched(addr string, nowMs int64) {
	if b.opened != 0 {
		b.probe(addr, nowMs)
	}
}

// probe marks the dispatch to addr as the half-open probe when it is one.
// It is Dispatched's path while some breaker is open, out of line
// (noinline) so that the check every decision makes stays inlined and small.
//
//go:noinline
func (b *Breakers) probe(addr string, nowMs int64) {
	if st := b.hosts[addr]; st != nil && st.openUntil != 0 && nowMs >= st.openUntil {
		st.probing = true
	}
}

// Result records the outcome of a request to addr and reports whether the
// breaker opened (or re-opened) because of it.
func (b *Breakers) Result(addr string, ok bool, nowMs int64) (opened bool) {
	if b.cfg.ConsecutiveFailures == 0 || ok && b.failing == 0 {
		return false
	}
	st := b.state(addr)
	if ok {
		if st.failures > 0 || st.openUntil != 0 {
			b.failing--
		}
		b.setOpenUntil(st, 0)
		*st = breakerState{}
		return false
	}
	if st.failures == 0 && st.openUntil == 0 {
		b.failing++
	}
	st.failures++
	if st.probing || (st.openUntil == 0 && st.failures >= b.cfg.ConsecutiveFailures) {
		b.setOpenUntil(st, nowMs+int64(b.cfg.CooldownMs))
		st.probing = false
		return true
	}
	return false
}

// Abandoned releases a probe whose request ended without an outcome (a
// client reset), so the next request can probe. It runs only for a stream
// that ends before its first response byte: noinline keeps its map lookup
// out of the stream-done callback every request enters.
//
//go:noinline
func (b *Breakers) Abandoned(addr string) {
	if st := b.hosts[addr]; st != nil {
		st.probing = false
	}
}
