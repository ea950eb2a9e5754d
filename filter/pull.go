package filter

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"

	"github.com/kvroute/kvroute/snapshot"
)

// Pulling the fleet snapshot (state.pull). Header-only mode cannot take
// pushes: without allow_on_headers_stop_iteration Envoy forwards a
// request's headers, and a push's bearer token, to an engine before the
// filter sees the body, so the state path refuses them there (501). Such a
// gateway fetches the snapshot itself instead: each worker's tick sends a
// GET to the metrics service's /state (dispatch_http_call to an Envoy
// cluster the operator names) every state.pull.intervalMs, and a snapshot
// newer than the one in force is validated and stored as a push would be
// (storeState: every worker of the gateway then applies it). The request
// carries the state token, when one is configured, so the service can
// tell gateways from strangers.
//
// A pull carries the other gateways' routes and the engines' removals
// pushed since the previous pull: it asks /state?since=<cursor>, the
// cursor the state in force came with (snapshot.State.Cursor), and the
// worker that stores a newer state applies them, as a push's.
//
// State: pulling and pulledAt are per worker (each worker pulls; the
// snapshot they store, and its cursor, are the gateway's). Two workers
// whose pulls cross store one state; both may apply its routes and
// removals, which marks blocks already marked and clears bits already
// clear. A metrics service that is down leaves the state in force to go
// stale as it would without pushes.

// pullState starts a pull when one is due and none is in flight.
func (p *routerPlugin) pullState(nowMs int64) {
	pc := &p.cfg.State.Pull
	if pc.Cluster == "" || p.pulling || nowMs-p.pulledAt < int64(pc.IntervalMs) && nowMs >= p.pulledAt {
		return
	}
	p.pulledAt = nowMs
	p.refreshState() // the gateway's cursor: another worker may have pulled since
	path := pc.Path
	if p.stateCursor != "" {
		// The routes and removals pushed since the state in force
		// (snapshot.Decode checks it: nothing to escape).
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		path += sep + "since=" + p.stateCursor
	}
	headers := [][2]string{{":method", "GET"}, {":path", path}, {":authority", pc.Authority}, {"accept", "application/json"}}
	if p.token != "" {
		headers = append(headers, [2]string{"authorization", "Bearer " + p.token})
	}
	if _, err := proxywasm.DispatchHttpCall(pc.Cluster, headers, nil, nil, uint32(pc.TimeoutMs), p.onPulled); err != nil {
		p.stats.statePullFailed.Increment(1)
		proxywasm.LogWarnf("kvroute.router: pulling state from cluster %s: %v (is state.pull.cluster an Envoy cluster?)", pc.Cluster, err)
		return
	}
	p.pulling = true
}

// onPulled takes a pull's answer.
func (p *routerPlugin) onPulled(_, bodySize, _ int) {
	p.pulling = false
	defer guard(&p.stats.recoveredPanics, "kvroute.router on_http_call_response", nil, nil)
	if err := p.takePulled(bodySize); err != nil {
		p.stats.statePullFailed.Increment(1)
		proxywasm.LogWarnf("kvroute.router: pulling state from cluster %s: %v", p.cfg.State.Pull.Cluster, err)
	}
}

func (p *routerPlugin) takePulled(bodySize int) error {
	hs, _ := proxywasm.GetHttpCallResponseHeaders()
	status := ""
	for _, h := range hs {
		if h[0] == ":status" {
			status = h[1]
		}
	}
	if status != "200" {
		return fmt.Errorf("status %q (want 200 from the metrics service's %s)", status, p.cfg.State.Pull.Path)
	}
	body, err := proxywasm.GetHttpCallResponseBody(0, bodySize)
	if err != nil {
		return err
	}
	st, err := snapshot.Decode(body)
	if err == nil && st.TimestampMs > p.now().UnixMilli()+maxPushAheadMs {
		err = fmt.Errorf("timestampMs %d is more than %d s ahead of this gateway's clock", st.TimestampMs, maxPushAheadMs/1000)
	}
	if err != nil {
		p.stats.stateRejected.Increment(1)
		return fmt.Errorf("invalid state snapshot: %w", err)
	}
	p.refreshState()
	if p.stateGen != 0 && st.TimestampMs <= p.stateTs {
		return nil // nothing newer than what this worker runs
	}
	gen, err := storeState(p.store, body, st.TimestampMs)
	var older *olderStateError
	if errors.As(err, &older) {
		return nil // another worker stored a newer one meanwhile
	}
	if err != nil {
		return fmt.Errorf("storing the state: %w", err)
	}
	p.stats.statePulls.Increment(1)
	// The other gateways' routes and the engines' removals since the
	// previous pull, applied to the gateway's index by the worker that
	// stored the state, as a push's are by the worker that took it.
	if len(st.Gateways) > 0 {
		p.learnReports(&st)
	}
	if len(st.Removals) > 0 {
		p.learnRemovals(st.Removals)
	}
	p.applyPushed(gen, st)
	return nil
}
