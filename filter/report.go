package filter

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"strconv"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/snapshot"
)

// Gateway reports (docs/topology.md). Every worker keeps the routes it
// decided since its last report (scope: worker; they are in this VM only)
// and POSTs them with the gateway's load counters to the metrics service
// on its tick; the service pushes every gateway's reports to every
// gateway, which marks the other gateways' routes in its index and prefix
// memory and counts their load. Scope of the result: the fleet, through
// the metrics service only. A gateway without the service keeps routing on
// its own knowledge: the other gateways' load pictures age out with the
// pushed state (stale state drops them).

// gatewayIDKey holds the gateway's id, made by the first worker that
// starts: every worker of one Envoy reports the same id.
const gatewayIDKey = "kvroute/gateway/id"

// maxReportRoutes bounds the routes one worker keeps between reports;
// past it routes are dropped (counted) until the next report.
const maxReportRoutes = 4096

// reporter is one worker's report in the making.
type reporter struct {
	gateway  string
	routes   []byte // JSON route objects, comma-separated
	n        int
	dropped  uint64
	lastMs   int64
	inFlight bool // a report is on its way: the next waits for its answer
	chainBuf []byte
	body     []byte
}

// gatewayID reads the gateway's id from shared data, making it if no
// worker has yet (16 hex digits, random).
func gatewayID() (string, error) {
	store := &sharedStore{emulated: emulatedHost}
	for range maxCASAttempts {
		v, _, err := store.Get(gatewayIDKey)
		if err == nil && len(v) > 0 {
			return string(v), nil
		}
		if err != nil && !errors.Is(err, index.ErrNotFound) {
			return "", err
		}
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], rand.Uint64())
		id := hex.EncodeToString(b[:])
		// A CAS no key has: if another worker made the id first, read it.
		if err := store.Set(gatewayIDKey, []byte(id), ^uint32(0)); err == nil {
			return id, nil
		}
	}
	return "", errors.New(gatewayIDKey + ": too much contention")
}

// startReports makes this worker a reporter: the gateway's id, and a tick
// at least as fast as the report interval.
func (p *routerPlugin) startReports() {
	rc := p.cfg.State.Report
	id, err := gatewayID()
	if err != nil {
		proxywasm.LogWarnf("kvroute.router: gateway id: %v (no routing reports from this worker)", err)
		return
	}
	if p.token == "" {
		proxywasm.LogWarnf("kvroute.router: state.report needs the state token (state.token or state.tokenEnv): the metrics service refuses reports without it")
	}
	p.reporter = &reporter{gateway: id}
	tick := rc.IntervalMs
	if p.adm != nil && p.cfg.Admission.TickMs < tick {
		tick = p.cfg.Admission.TickMs
	}
	if err := proxywasm.SetTickPeriodMilliSeconds(uint32(tick)); err != nil {
		proxywasm.LogWarnf("kvroute.router: setting the report tick: %v", err)
	}
}

// addRoute keeps one decision for the next report: addr now holds chain.
// The whole chain goes (from 0), so that a receiving gateway can also
// remember it in its prefix memory, whose keys are spread along the chain.
//
//go:noinline
func (r *reporter) addRoute(addr string, chain []uint64, promptTokens int) {
	const from = 0
	if len(chain) == 0 {
		return
	}
	if r.n >= maxReportRoutes {
		r.dropped++
		return
	}
	r.chainBuf = r.chainBuf[:0]
	for _, h := range chain[from:] {
		r.chainBuf = binary.LittleEndian.AppendUint64(r.chainBuf, h)
	}
	if r.n > 0 {
		r.routes = append(r.routes, ',')
	}
	r.routes = append(r.routes, `{"address":`...)
	r.routes = strconv.AppendQuote(r.routes, addr)
	r.routes = append(r.routes, `,"from":`...)
	r.routes = strconv.AppendInt(r.routes, int64(from), 10)
	r.routes = append(r.routes, `,"chain":"`...)
	r.routes = base64.StdEncoding.AppendEncode(r.routes, r.chainBuf)
	r.routes = append(r.routes, `","promptTokens":`...)
	r.routes = strconv.AppendInt(r.routes, int64(max(promptTokens, 0)), 10)
	r.routes = append(r.routes, '}')
	r.n++
}

// report sends this worker's report when the interval has passed: its
// routes and the gateway's load counters per host. Runs on the tick.
func (p *routerPlugin) report(nowMs int64) {
	r := p.reporter
	rc := &p.cfg.State.Report
	if r.inFlight || nowMs-r.lastMs < int64(rc.IntervalMs) && nowMs >= r.lastMs {
		return
	}
	if r.n == 0 && nowMs-r.lastMs < 1000 && nowMs >= r.lastMs {
		return // nothing routed: the load picture once a second is enough
	}
	r.lastMs = nowMs
	b := append(r.body[:0], `{"gateway":`...)
	b = strconv.AppendQuote(b, r.gateway)
	b = append(b, `,"timestampMs":`...)
	b = strconv.AppendInt(b, nowMs, 10)
	b = append(b, `,"routes":[`...)
	b = append(b, r.routes...)
	b = append(b, `],"load":[`...)
	loads := p.disp.Loads(nil)
	first := true
	for i := range p.hosts {
		h := &p.hosts[i]
		if h.Slot < 0 || h.Slot >= len(loads) {
			continue
		}
		l := loads[h.Slot]
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, `{"address":`...)
		b = strconv.AppendQuote(b, h.Address)
		b = append(b, `,"inFlight":`...)
		b = strconv.AppendUint(b, uint64(l.InFlight), 10)
		b = append(b, `,"prefillTokens":`...)
		b = strconv.AppendUint(b, uint64(l.PrefillTokens), 10)
		b = append(b, `,"decodeTokens":`...)
		b = strconv.AppendUint(b, uint64(l.DecodeTokens), 10)
		b = append(b, '}')
	}
	b = append(b, "]}"...)
	r.body = b
	r.routes, r.n = r.routes[:0], 0
	headers := [][2]string{
		{":method", "POST"}, {":path", rc.Path}, {":authority", rc.Authority},
		{"content-type", "application/json"}, {"authorization", "Bearer " + p.token},
	}
	if _, err := proxywasm.DispatchHttpCall(rc.Cluster, headers, b, nil, 2000, p.reported); err != nil {
		p.stats.reportsFailed.Increment(1)
		return
	}
	r.inFlight = true
}

// reported is the metrics service's answer to a report.
func (p *routerPlugin) reported(_, _, _ int) {
	p.reporter.inFlight = false
	status := ""
	if hs, err := proxywasm.GetHttpCallResponseHeaders(); err == nil {
		for _, h := range hs {
			if h[0] == ":status" {
				status = h[1]
			}
		}
	}
	if status == "204" || status == "200" {
		p.stats.reportsSent.Increment(1)
		return
	}
	p.stats.reportsFailed.Increment(1)
}

// learnReports applies the other gateways' routes in a push: each marks
// its chain as held by its host in the index and the prefix memory. Only
// the worker that received the push does it (the index and the memory are
// the gateway's), and it does it for a push refused as older too: a route
// is a fact, not state, and applying it twice changes nothing.
func (p *routerPlugin) learnReports(st *pushedState) {
	own := ""
	if p.reporter != nil {
		own = p.reporter.gateway
	}
	var chain []uint64
	for i := range st.Gateways {
		rep := &st.Gateways[i]
		if rep.Gateway == own {
			continue
		}
		for _, rt := range rep.Routes {
			ref, ok := p.disp.Lookup(rt.Address)
			if !ok {
				continue
			}
			raw, err := base64.StdEncoding.DecodeString(rt.Chain)
			if err != nil || len(raw)%8 != 0 {
				continue // validated at decode; never trust twice
			}
			chain = chain[:0]
			for range rt.From {
				chain = append(chain, 0) // before From: not read (segment-aligned)
			}
			for j := 0; j+8 <= len(raw); j += 8 {
				chain = append(chain, binary.LittleEndian.Uint64(raw[j:]))
			}
			if err := p.disp.Learn(ref, rt.Address, chain, rt.From); err != nil {
				p.stats.indexErrors.Increment(1)
			}
		}
	}
}

// learnRemovals applies the engines' evictions a push carries: each
// truncates its host's chain in the index (index.Removed), in the worker
// that received the push (the index is the gateway's shared data). A
// removal applied twice clears bits already clear, so the same removal
// from two service replicas, or from a push refused as older, is harmless.
// The prefix memory keeps its entries: it remembers where a prefix went,
// and the index's match, not the memory, predicts what a host holds.
//
//go:noinline
func (p *routerPlugin) learnRemovals(rs []snapshot.Removal) {
	var chain []uint64
	for _, rm := range rs {
		ref, ok := p.disp.Lookup(rm.Address)
		if !ok {
			continue
		}
		raw, err := base64.StdEncoding.DecodeString(rm.Chain)
		if err != nil || len(raw)%8 != 0 {
			continue // validated at decode; never trust twice
		}
		chain = chain[:0]
		for j := 0; j+8 <= len(raw); j += 8 {
			chain = append(chain, binary.LittleEndian.Uint64(raw[j:]))
		}
		if err := p.disp.Removed(ref, chain, rm.From); err != nil {
			p.stats.indexErrors.Increment(1)
			continue
		}
		p.stats.removalsApplied.Increment(1)
	}
}

// remoteLoads sets every host's view of the other gateways' load from a
// push (scorer.Host.LoadMirror): the newest picture per gateway; with this
// gateway's own picture among them, own counts stand for every gateway's
// change since the reports.
func (p *routerPlugin) remoteLoads(reps []snapshot.GatewayReport) {
	own := ""
	if p.reporter != nil {
		own = p.reporter.gateway
	}
	newest := map[string]*snapshot.GatewayReport{}
	for i := range reps {
		r := &reps[i]
		if r.Load == nil {
			continue
		}
		if o := newest[r.Gateway]; o == nil || o.TimestampMs < r.TimestampMs {
			newest[r.Gateway] = r
		}
	}
	for i := range p.hosts {
		h := &p.hosts[i]
		h.RemoteInFlight, h.RemotePrefillTokens, h.RemoteDecodeTokens, h.LoadMirror = 0, 0, 0, 0
	}
	if len(newest) == 0 || len(newest) == 1 && newest[own] != nil {
		return
	}
	g := int64(len(newest))
	mine := newest[own]
	if mine == nil {
		g = 1 // no own picture to scale against: plain sums
	}
	for gw, r := range newest {
		k := int64(1)
		if gw == own {
			k = -(g - 1)
		}
		for _, l := range r.Load {
			j, ok := p.pos[l.Address]
			if !ok {
				continue
			}
			h := &p.hosts[j]
			h.RemoteInFlight += int(k * int64(l.InFlight))
			h.RemotePrefillTokens += k * l.PrefillTokens
			h.RemoteDecodeTokens += k * l.DecodeTokens
			h.LoadMirror = int(g)
		}
	}
}

// dropRemote forgets the other gateways' load when the pushed state is
// stale: without the metrics service a gateway routes on its own counts.
// Out of prepare's line (noinline): state is rarely stale.
//
//go:noinline
func (p *routerPlugin) dropRemote() {
	for i := range p.hosts {
		p.hosts[i].LoadMirror = 0
	}
}
