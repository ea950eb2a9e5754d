package metricsvc

import (
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/snapshot"
)

// Gateway reports (docs/topology.md): every gateway POSTs its recent routing
// (all its workers', gathered in its shared data) and its load to
// /v1/reports once per interval; the service
// keeps the routes until its next push and each gateway's newest load
// picture while it is fresh, and pushes them to every gateway with the
// snapshot (snapshot.State.Gateways). A push goes out as soon as a report
// arrives (merged with the scrapes' wake-ups), so a route reaches the other
// gateways within a report interval plus two POSTs.
//
// Scope: one service instance. Two replicas each receive some reports (each
// POST reaches one, as Envoy's cluster picks) and push what they received;
// a gateway applies every report it gets, and a report applied twice
// changes nothing (a route marks blocks already marked, a load picture
// older than the one held is ignored). One replica takes a gateway's report
// of one seq once (a retried POST); the same report reaching both replicas
// (a retry that went to the other) is pushed by both and applied twice,
// which changes nothing.

const (
	// maxPendingRoutes bounds the routes kept between two pushes; past it
	// the oldest are dropped (a gateway then learns those prefixes from
	// its own routing only).
	maxPendingRoutes = 20_000
	// loadFresh is how long a gateway's load picture is pushed after its
	// last report: a gateway that stops reporting drops out.
	loadFresh = 5 * time.Second
	// maxReportBytes bounds one report's body.
	maxReportBytes = 8 << 20
	// ReportsPath is where gateways POST their reports.
	ReportsPath = "/v1/reports"
)

// reportBook holds what the next push carries.
type reportBook struct {
	mu     sync.Mutex
	routes []snapshot.GatewayReport // pending, routes only
	nRoute int
	load   map[string]snapshot.GatewayReport // newest load picture per gateway
	dirty  bool                              // something new since the last take
	// removals are the engines' bridged evictions for the next push
	// (bridge.go).
	removals []snapshot.Removal
	// seen are the seqs of each gateway's latest reports (at most
	// seenSeqs): a report seen already is not taken again.
	seen map[string][]uint64
	// Received and Dropped count reports taken and routes dropped;
	// Duplicates the reports refused as seen already;
	// RemovalsDropped the removals dropped past maxPendingRemovals.
	Received, Dropped, RemovalsDropped, Duplicates uint64
}

// seenSeqs is how many of a gateway's latest report seqs the service
// remembers: a retried POST arrives within a few reports of the original.
const seenSeqs = 16

// duplicate reports whether gateway's report seq was taken already, and
// remembers it otherwise (seq 0 is not numbered: never a duplicate). The
// map is pruned with the load pictures at every push: a gateway gone for
// loadFresh is forgotten, so pod churn does not grow it.
func (b *reportBook) duplicate(gateway string, seq uint64) bool {
	if seq == 0 {
		return false
	}
	if b.seen == nil {
		b.seen = map[string][]uint64{}
	}
	s := b.seen[gateway]
	for _, x := range s {
		if x == seq {
			return true
		}
	}
	if len(s) >= seenSeqs {
		s = append(s[:0], s[1:]...)
	}
	b.seen[gateway] = append(s, seq)
	return false
}

func (b *reportBook) addRemovals(rs []snapshot.Removal) {
	if len(rs) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.removals = append(b.removals, rs...)
	if over := len(b.removals) - maxPendingRemovals; over > 0 {
		b.RemovalsDropped += uint64(over)
		b.removals = append(b.removals[:0], b.removals[over:]...)
	}
	b.dirty = true
}

// takeRemovals returns the removals the next push carries and forgets them.
func (b *reportBook) takeRemovals() []snapshot.Removal {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.removals
	b.removals = nil
	return out
}

func (b *reportBook) add(r snapshot.GatewayReport) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.duplicate(r.Gateway, r.Seq) {
		b.Duplicates++
		return
	}
	b.Received++
	if len(r.Routes) > 0 {
		b.routes = append(b.routes, snapshot.GatewayReport{Gateway: r.Gateway, TimestampMs: r.TimestampMs, Seq: r.Seq, Routes: r.Routes})
		b.nRoute += len(r.Routes)
		for b.nRoute > maxPendingRoutes && len(b.routes) > 1 {
			b.nRoute -= len(b.routes[0].Routes)
			b.Dropped += uint64(len(b.routes[0].Routes))
			b.routes = b.routes[1:]
		}
		b.dirty = true
	}
	if r.Load != nil {
		if b.load == nil {
			b.load = map[string]snapshot.GatewayReport{}
		}
		if old, ok := b.load[r.Gateway]; !ok || old.TimestampMs < r.TimestampMs {
			b.load[r.Gateway] = snapshot.GatewayReport{Gateway: r.Gateway, TimestampMs: r.TimestampMs, Load: r.Load}
			b.dirty = true
		}
	}
}

// take returns what the next push carries: the pending routes (which it
// forgets) and every fresh load picture, and whether anything is new.
func (b *reportBook) take(now time.Time) ([]snapshot.GatewayReport, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.routes
	b.routes, b.nRoute = nil, 0
	for g, r := range b.load {
		if now.UnixMilli()-r.TimestampMs > loadFresh.Milliseconds() {
			delete(b.load, g)
			continue
		}
		out = append(out, r)
	}
	for g := range b.seen {
		if _, ok := b.load[g]; !ok {
			delete(b.seen, g) // gone (or never sent load): forget its seqs
		}
	}
	dirty := b.dirty
	b.dirty = false
	return out, dirty
}

// serveReport takes one gateway's report.
func (s *Service) serveReport(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Token == nil {
		http.Error(w, "reports are disabled: the service has no push token", http.StatusUnauthorized)
		return
	}
	want, err := s.cfg.Token.Token()
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if err != nil || want == "" || !ok || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(want)) != 1 {
		http.Error(w, "a valid 'Authorization: Bearer <token>' (the push token) is required", http.StatusUnauthorized)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxReportBytes+1))
	if err != nil {
		http.Error(w, "reading the report: "+err.Error(), http.StatusBadRequest)
		return
	}
	if len(body) > maxReportBytes {
		http.Error(w, fmt.Sprintf("the report is larger than %d bytes", maxReportBytes), http.StatusRequestEntityTooLarge)
		return
	}
	var rep snapshot.GatewayReport
	if err := json.Unmarshal(body, &rep); err != nil {
		http.Error(w, "the report is not a gateway report (JSON): "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := checkReport(&rep); err != nil {
		http.Error(w, "invalid gateway report: "+err.Error(), http.StatusBadRequest)
		return
	}
	s.reports.add(rep)
	s.bridgeRoutes(&rep, s.cfg.bridgeClock())
	s.notify()
	w.WriteHeader(http.StatusNoContent)
}

// checkReport validates what the service passes on to every gateway.
func checkReport(r *snapshot.GatewayReport) error {
	if r.Gateway == "" || len(r.Gateway) > 64 {
		return errors.New("gateway: must be an id of 1 to 64 characters")
	}
	if r.TimestampMs <= 0 {
		return errors.New("timestampMs: must be a positive Unix time in milliseconds")
	}
	for i, rt := range r.Routes {
		if rt.Address == "" || rt.From < 0 {
			return fmt.Errorf("routes[%d]: needs an address and a from >= 0", i)
		}
		n, err := base64.StdEncoding.DecodeString(rt.Chain)
		if err != nil || len(n)%8 != 0 {
			return fmt.Errorf("routes[%d].chain: must be base64 of 8-byte block hashes", i)
		}
	}
	for i, l := range r.Load {
		if l.Address == "" || l.InFlight < 0 || l.PrefillTokens < 0 || l.DecodeTokens < 0 {
			return fmt.Errorf("load[%d]: needs an address and counts >= 0", i)
		}
	}
	return nil
}
